#!/bin/sh
# Let the host run ARCH's (Debian's name) programs, for the maintainer scripts of a foreign
# guest root: binfmt_misc mounted and qemu-user-static's handler registered, as
# systemd-binfmt does at boot (a container or a fresh VM may have neither).
# Nothing to do for the host's own architecture.
# Usage: binfmt.sh ARCH
set -eu
arch=$1
[ "$arch" != "$(dpkg --print-architecture)" ] || exit 0
case $arch in
    arm64) name=qemu-aarch64 ;;
    *) echo "binfmt.sh: no qemu-user handler known for $arch" >&2; exit 1 ;;
esac
binfmt=/proc/sys/fs/binfmt_misc
mountpoint -q "$binfmt" || mount -t binfmt_misc binfmt_misc "$binfmt"
# qemu-user-static's binfmt.d line is in the register file's own syntax.
[ -e "$binfmt/$name" ] || cat "/usr/lib/binfmt.d/$name.conf" > "$binfmt/register"
grep -qx enabled "$binfmt/$name" || { echo "binfmt.sh: $name is not enabled in $binfmt" >&2; exit 1; }
