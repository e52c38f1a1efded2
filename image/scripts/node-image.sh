#!/bin/sh
# The node daemon's OCI image as an OCI image archive (a tar of an OCI image layout), its one
# image named guestagent-node:VERSION (what image/node/daemonset.yaml runs). Built with umoci
# from the node bundle's tree: no base image, no registry. Its one layer is the tree under
# /opt/guestagent-node and the minimum a container needs (/etc/passwd and /etc/group naming
# root, an empty /tmp); the runtime mounts /proc, /sys and /dev. The layer and the archive are
# packed by tar.sh as the bundles are (sorted, root-owned, mtime 0) and every timestamp is the
# epoch, so equal inputs give equal bytes.
# Usage: node-image.sh NODE_BUNDLE OUTPUT VERSION [MACHINE]
set -eu
bundle=$1 output=$2 version=$3 machine=${4:-x86_64}
case $machine in
x86_64) arch=amd64 ;;
aarch64) arch=arm64 ;;
*) echo "node-image.sh: no OCI architecture for $machine" >&2; exit 1 ;;
esac
epoch=1970-01-01T00:00:00Z
name=guestagent-node:$version
prefix=/opt/guestagent-node

work=$output.d
rm -rf "$work"
mkdir -p "$work/rootfs/etc" "$work/rootfs/tmp"
tar -C "$work/rootfs" -xJf "$bundle" "${prefix#/}"
echo "root:x:0:0:root:/:/nonexistent" > "$work/rootfs/etc/passwd"
echo "root:x:0:" > "$work/rootfs/etc/group"
chmod 644 "$work/rootfs/etc/passwd" "$work/rootfs/etc/group"
chmod 1777 "$work/rootfs/tmp"
sh "$(dirname "$0")/tar.sh" "$work/rootfs" etc tmp "${prefix#/}" > "$work/layer.tar"

layout=$work/layout
umoci init --layout "$layout"
umoci new --image "$layout:$name"
umoci raw add-layer --image "$layout:$name" --history.created "$epoch" \
    --history.created_by "image/scripts/node-image.sh" "$work/layer.tar"
# LC_ALL=C: the entry script runs once (it starts itself again under any other locale).
umoci config --image "$layout:$name" --no-history --created "$epoch" \
    --architecture "$arch" --os linux --config.user 0:0 --config.env LC_ALL=C \
    --config.entrypoint "$prefix/bin/guestctl" --config.entrypoint node \
    --config.exposedports 9465/tcp --config.workingdir /
umoci gc --layout "$layout"

sh "$(dirname "$0")/tar.sh" "$layout" oci-layout index.json blobs > "$output.partial"
mv "$output.partial" "$output"
echo "node-image.sh: $output: $(stat -c %s "$output") bytes," \
    "layer $(stat -c %s "$work/layer.tar") bytes unpacked"
rm -rf "$work"
