#!/bin/sh
# Build the Debian base rootfs tarball, or reuse the cached one built from the same inputs.
# Prints the tarball's path to OUTPUT (a stamp file, so make sees build-tree mtimes).
# ARCH is Debian's (amd64, arm64); a foreign one runs its maintainer scripts under
# qemu-user-static through binfmt_misc (scripts/binfmt.sh registers it).
# Usage: base.sh PACKAGES_FILE CACHE_DIR OUTPUT [ARCH]
set -eu
packages_file=$1 cache=$2 output=$3 arch=${4:-amd64}

suite=bookworm
mirror=http://deb.debian.org/debian
security=http://deb.debian.org/debian-security
key=$( (cat "$packages_file" "$0"; echo "$suite $mirror $security $arch") | sha256sum | cut -c1-16)
tarball=$cache/base-$key.tar

if [ ! -s "$tarball" ]; then
    mkdir -p "$cache"
    "$(dirname "$0")/binfmt.sh" "$arch"
    # Docs, man pages and locales are a third of minbase and nothing in the guest reads them.
    # The merged-usr hook merges /usr itself; the usrmerge package would pull in 50 MB of perl.
    mmdebstrap --variant=minbase --mode=root --architectures="$arch" \
        --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
        --include="$(paste -sd, "$packages_file")" \
        --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/info/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        --customize-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/*' \
        "$suite" "$cache/base-$key.partial-$$.tar" \
        "deb $mirror $suite main" "deb $mirror $suite-updates main" "deb $security $suite-security main"
    mv "$cache/base-$key.partial-$$.tar" "$tarball"
fi
echo "$tarball" > "$output"
