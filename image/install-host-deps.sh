#!/bin/sh
# Install the Debian 12 host packages that building the guest image and running the VM tests
# need. Idempotent, and quick when everything is already there: apt runs only for what is missing.
set -eu
packages="make qemu-system-x86 qemu-utils mmdebstrap debian-archive-keyring e2fsprogs cpio gzip
    kmod busybox-static python3 python3-pip python3-venv apt coreutils patchelf xz-utils binutils
    erofs-utils cryptsetup-bin fdisk qemu-system-arm qemu-user-static arch-test
    golang-go protobuf-compiler protoc-gen-go protoc-gen-go-grpc golang-google-grpc-dev
    golang-google-protobuf-dev golang-github-golang-protobuf-1-5-dev golang-google-genproto-dev
    umoci podman runc"
# The Go packages build the Go client test (tests/go) from Debian's sources alone: no module
# downloads, as a runtime author's CI without a proxy would.
# umoci builds the node daemon's OCI image from its tree (no base image, no registry); podman
# runs it in tests/integration/test_node_image.py, under runc, as a cluster's containerd does.
# The arm64 build takes its runtime, kernel and guest root from Debian's arm64 packages.
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    dpkg --add-architecture arm64
    apt-get update
fi
missing=""
for package in $packages; do
    dpkg-query -W -f='${Status}\n' "$package" 2>/dev/null | grep -q '^install ok installed$' ||
        missing="$missing $package"
done
# The image build resolves the guest kernel from the apt lists, so they must not be empty.
if [ -n "$missing" ] || ! apt-cache show linux-image-cloud-amd64 >/dev/null 2>&1 ||
    ! apt-cache show linux-image-cloud-arm64 >/dev/null 2>&1; then
    apt-get update
fi
if [ -n "$missing" ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $missing
fi
