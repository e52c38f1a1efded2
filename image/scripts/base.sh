#!/bin/sh
# Build the Debian base rootfs tarball, or reuse the cached one built from the same inputs.
# Prints the tarball's path to OUTPUT (a stamp file, so make sees build-tree mtimes).
# Usage: base.sh PACKAGES_FILE CACHE_DIR OUTPUT
set -eu
packages_file=$1 cache=$2 output=$3

suite=bookworm
mirror=http://deb.debian.org/debian
security=http://deb.debian.org/debian-security
key=$( (cat "$packages_file" "$0"; echo "$suite $mirror $security") | sha256sum | cut -c1-16)
tarball=$cache/base-$key.tar

if [ ! -s "$tarball" ]; then
    mkdir -p "$cache"
    # Docs, man pages and locales are a third of minbase and nothing in the guest reads them.
    # The merged-usr hook merges /usr itself; the usrmerge package would pull in 50 MB of perl.
    mmdebstrap --variant=minbase --mode=root \
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
