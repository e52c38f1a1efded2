#!/bin/sh
# The bundle for any systemd guest: a tarball that unpacks at a guest rootfs's top into
# /opt/guestagent (the agent with its own runtime: interpreter, libraries, loader, tools),
# /etc/systemd/system/guestagent.service, /etc/default/guestagent and
# /etc/tmpfiles.d/guestagent.conf (turns on the multi-gen LRU). Packed by tar.sh and xz on one
# thread: equal inputs give equal bytes (xz: 12 MB where gzip made 16.7 MB of the interpreter,
# glibc and grpc).
# Usage: bundle.sh DEBS_STAMP DEPS_STAMP WHEEL IMAGE_DIR OUTPUT [MACHINE]
set -eu
debs=$(cat "$1") deps=$(cat "$2") wheel=$3 image=$4 output=$5 machine=${6:-x86_64}
repo=$(cd "$image/.." && pwd)
prefix=/opt/guestagent

staging=$output.d
rm -rf "$staging"
mkdir -p "$staging/etc/systemd/system" "$staging/etc/default" "$staging/etc/tmpfiles.d"
# The ELF check's list goes to the build log: every file, its loader and its libraries.
PYTHONPATH=$repo python3 -m guestagent.build.runtime --debs "$debs/root" --site "$deps" \
    --wheel "$wheel" --prefix "$prefix" --out "$staging$prefix" --machine "$machine"
install -m 644 "$image/guestagent.service" "$staging/etc/systemd/system/guestagent.service"
install -m 644 "$image/guestagent.default" "$staging/etc/default/guestagent"
install -m 644 "$image/guestagent.tmpfiles" "$staging/etc/tmpfiles.d/guestagent.conf"

sh "$image/scripts/tar.sh" "$staging" "${prefix#/}" \
    etc/systemd/system/guestagent.service etc/default/guestagent etc/tmpfiles.d/guestagent.conf |
    xz -9 --threads=1 > "$output.partial"
mv "$output.partial" "$output"
echo "bundle.sh: $output: $(stat -c %s "$output") bytes packed," \
    "$(du -sb --apparent-size "$staging$prefix" | cut -f1) bytes unpacked in $prefix"
rm -rf "$staging"
