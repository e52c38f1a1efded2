#!/bin/sh
# Build the initramfs: static busybox, the boot modules listed by kernel.sh, and initramfs-init.
# Usage: initrd.sh KERNEL_DIR INIT_SCRIPT OUTPUT
set -eu
kernel=$1 init=$2 output=$3

staging=$output.d
rm -rf "$staging"
mkdir -p "$staging/bin" "$staging/dev" "$staging/proc" "$staging/sys" "$staging/lib/modules"
# A dynamically linked busybox (Debian's "busybox" package) would find no libc in the initramfs.
if ldd /bin/busybox >/dev/null 2>&1; then
    echo "initrd.sh: /bin/busybox is dynamically linked; install busybox-static" >&2
    exit 1
fi
cp /bin/busybox "$staging/bin/busybox"
install -m 755 "$init" "$staging/init"
while read -r module; do
    cp "$kernel/root$module" "$staging/lib/modules/"
    echo "/lib/modules/${module##*/}"
done < "$kernel/boot.list" > "$staging/lib/modules/boot.list"
(cd "$staging" && find . | sort | cpio --quiet -o -H newc -R 0:0) | gzip -9 > "$output.partial"
mv "$output.partial" "$output"
rm -rf "$staging"
