#!/bin/sh
# Assemble the guest root filesystem from the cached layers and write it as an ext4 image
# with mkfs.ext4 -d (no loop mount, so no privileges beyond file ownership are needed).
# Usage: rootfs.sh BASE_STAMP KERNEL_DIR DEPS_STAMP WHEEL IMAGE_DIR OUTPUT
# (the stamps hold the cached base tarball's and dependency tree's paths)
set -eu
base=$(cat "$1") kernel=$2 deps=$(cat "$3") wheel=$4 image=$5 output=$6

staging=$output.d
rm -rf "$staging"
mkdir -p "$staging"
tar -C "$staging" -xf "$base"

# Kernel modules: those loaded at boot, plus the small directories the agent may modprobe
# from on demand (zram compressors, virtio_mem, ...); the rest of the 90 MB tree stays out.
kver=$(cat "$kernel/version")
modules=lib/modules/$kver
(cd "$kernel/root" && {
    sed 's|^/||' "$kernel/boot.list"
    find "$modules/kernel/arch/x86/crypto" "$modules/kernel/crypto" "$modules/kernel/lib" \
        "$modules/kernel/mm" "$modules/kernel/drivers/virtio" "$modules/kernel/drivers/block" \
        -name '*.ko'
    ls "$modules"/modules.builtin* "$modules/modules.order"
} | sort -u | cpio --quiet -pdm "$staging/usr")
depmod -b "$staging/usr" "$kver"

# /opt/guestagent is a venv over the guest's /usr/bin/python3 (3.11), filled from the host:
# the cached dependency tree, then the agent wheel with its console script pointed at the venv.
venv=$staging/opt/guestagent
site=$venv/lib/python3.11/site-packages
mkdir -p "$venv/bin" "$site"
printf 'home = /usr/bin\ninclude-system-site-packages = false\nversion = 3.11\n' > "$venv/pyvenv.cfg"
ln -s /usr/bin/python3 "$venv/bin/python"
ln -s python "$venv/bin/python3"
cp -a "$deps/." "$site/"
/usr/bin/python3 -m pip install --quiet --disable-pip-version-check --no-compile --no-deps \
    --root-user-action=ignore --target "$site" "$wheel"
for script in "$site/bin/"*; do
    sed '1s|^#!.*|#!/opt/guestagent/bin/python|' "$script" > "$venv/bin/${script##*/}"
    chmod 755 "$venv/bin/${script##*/}"
done
rm -rf "$site/bin"
# The root disk is a throwaway snapshot, so bytecode the guest wrote would be lost at every
# boot; compile it here instead (host and guest are both Debian 12's CPython 3.11).
/usr/bin/python3 -m compileall -q -j 0 --invalidation-mode unchecked-hash -s "$staging" -p / "$venv/lib"

install -m 755 "$image/init" "$staging/sbin/guestagent-init"
install -m 755 "$image/testexec.py" "$staging/usr/local/sbin/guestagent-testexec"
install -m 644 "$image/guestagent.service" "$staging/etc/systemd/system/guestagent.service"
for applet in poweroff reboot halt; do ln -sf /bin/busybox "$staging/usr/local/sbin/$applet"; done
# Keep the kernel's eth0 name: udev's default link policy would rename it.
mkdir -p "$staging/etc/systemd/network"
ln -sf /dev/null "$staging/etc/systemd/network/99-default.link"
echo guest > "$staging/etc/hostname"

# Leave a quarter of free space (plus 64 MiB) for logs, swap files and test data.
used_mib=$(du -sm "$staging" | cut -f1)
rm -f "$output.partial"
truncate -s "$((used_mib * 5 / 4 + 64))M" "$output.partial"
mkfs.ext4 -q -L guestroot -d "$staging" "$output.partial"
mv "$output.partial" "$output"
rm -rf "$staging"
