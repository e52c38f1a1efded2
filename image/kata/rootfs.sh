#!/bin/sh
# Build the Kata-like test guest root (rootfs-kata.img): Debian trixie from mmdebstrap
# --variant=required, as kata's osbuilder builds its own rootfs, with systemd as PID 1, the
# guest extension units (kata-extension-mount@.service, its generator and scripts), a stand-in
# for kata-agent, and test-only units (network, tcp-to-vsock relay, a workload cgroup).
# No python, and no mkswap: the agent must bring its own. Both are checked here.
# The base tarball is cached in CACHE_DIR, keyed by its inputs.
# Usage: rootfs.sh CACHE_DIR KATA_DIR OUTPUT
set -eu
cache=$1 kata=$2 output=$3

suite=trixie
mirror=http://deb.debian.org/debian
key=$( (grep -v '^#' "$kata/packages.txt"; echo "$suite $mirror required") | sha256sum | cut -c1-16)
tarball=$cache/kata-base-$key.tar
if [ ! -s "$tarball" ]; then
    mkdir -p "$cache"
    mmdebstrap --variant=required --mode=root \
        --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
        --keyring=/usr/share/keyrings/debian-archive-keyring.gpg \
        --include="$(grep -v '^#' "$kata/packages.txt" | paste -sd,)" \
        --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/info/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        --customize-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/*' \
        "$suite" "$cache/kata-base-$key.partial-$$.tar" "deb $mirror $suite main"
    mv "$cache/kata-base-$key.partial-$$.tar" "$tarball"
fi

staging=$output.d
rm -rf "$staging"
mkdir -p "$staging"
tar -C "$staging" -xf "$tarball"

pythons=$(find "$staging" -name 'python*' \( -type f -o -type l \) -path '*/bin/*')
[ -z "$pythons" ] || { echo "rootfs.sh: the Kata-like root must hold no python: $pythons" >&2; exit 1; }
# The agent runs its own mkswap: removing the guest's proves it in the VM test.
rm -f "$staging/usr/sbin/mkswap" "$staging/sbin/mkswap"
if [ -n "$(find "$staging" -name mkswap -path "*bin/*")" ]; then
    echo "rootfs.sh: a mkswap is left in the root" >&2
    exit 1
fi

units=$staging/etc/systemd/system
libexec=$staging/usr/libexec/kata-extension
mkdir -p "$libexec" "$staging/usr/lib/systemd/system-generators"
install -m 755 "$kata/kata-extension-generator" "$staging/usr/lib/systemd/system-generators/"
install -m 644 "$kata/kata-extension-mount@.service" "$staging/usr/lib/systemd/system/"
install -m 755 "$kata/kata-extension-mount" "$libexec/mount"
install -m 755 "$kata/kata-extension-umount" "$libexec/umount"
install -m 755 "$kata/kata-agent-standin" "$libexec/kata-agent-standin"
for unit in kata-containers.target kata-agent.service kata-test-net.service \
    kata-test-vsock-relay.service kata-test-workload.service kata-test-operator-unit.service; do
    install -m 644 "$kata/$unit" "$units/$unit"
done
systemctl --root="$staging" --quiet enable kata-test-vsock-relay.service \
    kata-test-workload.service kata-test-operator-unit.service
ln -sf kata-containers.target "$units/default.target"
# No udev here, so device units for serial consoles never appear: no getty waiting on them.
systemctl --root="$staging" --quiet mask serial-getty@ttyS0.service getty@tty1.service \
    systemd-networkd.service systemd-timesyncd.service 2>/dev/null || true
mkdir -p "$staging/run/kata-extensions"
echo kata-guest > "$staging/etc/hostname"

"$(dirname "$0")/../scripts/ext4-image.sh" "$staging" kataroot "$output"
