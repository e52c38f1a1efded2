#!/bin/sh
# The node daemon's bundle for a host: a tarball that unpacks at / into /opt/guestagent-node
# (guestctl with its own runtime: interpreter, libraries, loader; no Python needed on the
# host), /etc/systemd/system/guestagent-node.service and /etc/guestagent/node.toml (the
# policy, every key commented at its default). Packed as the guest's bundle is (tar.sh, xz on
# one thread): equal inputs give equal bytes.
# Usage: node-bundle.sh DEBS_STAMP DEPS_STAMP WHEEL IMAGE_DIR OUTPUT [MACHINE]
set -eu
debs=$(cat "$1") deps=$(cat "$2") wheel=$3 image=$4 output=$5 machine=${6:-x86_64}
repo=$(cd "$image/.." && pwd)
prefix=/opt/guestagent-node

staging=$output.d
rm -rf "$staging"
mkdir -p "$staging/etc/systemd/system" "$staging/etc/guestagent"
# The ELF check's list goes to the build log: every file, its loader and its libraries.
PYTHONPATH=$repo python3 -m guestagent.build.runtime --tree node --debs "$debs/root" \
    --site "$deps" --wheel "$wheel" --prefix "$prefix" --out "$staging$prefix" \
    --machine "$machine"
install -m 644 "$image/node/guestagent-node.service" \
    "$staging/etc/systemd/system/guestagent-node.service"
install -m 644 "$image/node/node.toml" "$staging/etc/guestagent/node.toml"

sh "$image/scripts/tar.sh" "$staging" "${prefix#/}" \
    etc/systemd/system/guestagent-node.service etc/guestagent/node.toml |
    xz -9 --threads=1 > "$output.partial"
mv "$output.partial" "$output"
echo "node-bundle.sh: $output: $(stat -c %s "$output") bytes packed," \
    "$(du -sb --apparent-size "$staging$prefix" | cut -f1) bytes unpacked in $prefix"
rm -rf "$staging"
