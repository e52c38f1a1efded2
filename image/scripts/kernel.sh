#!/bin/sh
# Fetch the Debian cloud kernel (cached by package version), unpack it into OUT_DIR, and list
# the boot modules from MODULES_FILE with their dependencies, in load order, in OUT_DIR/boot.list.
# ARCH is Debian's (amd64, arm64); a foreign one needs it added with dpkg --add-architecture.
# Usage: kernel.sh MODULES_FILE CACHE_DIR OUT_DIR [ARCH]
set -eu
modules_file=$1 cache=$2 out=$3 arch=${4:-amd64}

package=$(apt-cache depends "linux-image-cloud-$arch:$arch" | awk '/Depends: linux-image-/ {sub(/:.*/, "", $2); print $2; exit}')
version=$(apt-cache show --no-all-versions "$package:$arch" | awk '/^Version:/ {print $2}')
[ -n "$package" ] && [ -n "$version" ] || { echo "kernel.sh: cannot resolve linux-image-cloud-$arch; run apt-get update" >&2; exit 1; }
deb=$cache/kernel/${package}_${version}_$arch.deb

if [ ! -s "$deb" ]; then
    mkdir -p "$cache/kernel"
    (cd "$cache/kernel" && apt-get download -q "$package:$arch=$version")
fi

rm -rf "$out" && mkdir -p "$out"
dpkg-deb -x "$deb" "$out/root"
kver=$(ls "$out/root/lib/modules")
depmod -b "$out/root" "$kver"
echo "$kver" > "$out/version"
cp "$out/root/boot/vmlinuz-$kver" "$out/vmlinuz"

# modprobe prints "insmod PATH" for each module to load (deps first) and "builtin NAME" otherwise.
grep -v '^#' "$modules_file" | while read -r module; do
    modprobe -d "$out/root" -S "$kver" --show-depends "$module"
done | awk '$1 == "insmod" && !seen[$2]++ {print $2}' | sed "s|^.*/lib/modules/|/lib/modules/|" > "$out/boot.list"
