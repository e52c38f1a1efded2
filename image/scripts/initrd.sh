#!/bin/sh
# Build the initramfs: static busybox, the boot modules listed by kernel.sh, and initramfs-init.
# BUSYBOX is a static busybox for the kernel's architecture (the host's by default).
# Usage: initrd.sh KERNEL_DIR INIT_SCRIPT OUTPUT [BUSYBOX]
set -eu
kernel=$1 init=$2 output=$3 busybox=${4:-/bin/busybox}

staging=$output.d
rm -rf "$staging"
mkdir -p "$staging/bin" "$staging/dev" "$staging/proc" "$staging/sys" "$staging/lib/modules"
# A dynamically linked busybox (Debian's "busybox" package) would find no libc in the initramfs.
if readelf -l "$busybox" | grep -q 'Requesting program interpreter'; then
    echo "initrd.sh: $busybox is dynamically linked; install busybox-static" >&2
    exit 1
fi
cp "$busybox" "$staging/bin/busybox"
install -m 755 "$init" "$staging/init"
while read -r module; do
    cp "$kernel/root$module" "$staging/lib/modules/"
    echo "/lib/modules/${module##*/}"
done < "$kernel/boot.list" > "$staging/lib/modules/boot.list"
(cd "$staging" && find . | sort | cpio --quiet -o -H newc -R 0:0) | gzip -9 > "$output.partial"
mv "$output.partial" "$output"
rm -rf "$staging"
