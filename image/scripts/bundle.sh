#!/bin/sh
# The extension bundle for any systemd guest: a tarball that unpacks at a guest rootfs's top
# into /opt/guestagent (the venv), /etc/systemd/system/guestagent.service,
# /etc/default/guestagent and /etc/tmpfiles.d/guestagent.conf (turns on the multi-gen LRU). Owned by root, sorted, with fixed mtimes, so equal inputs give equal
# bytes.
# Usage: bundle.sh DEPS_STAMP WHEEL IMAGE_DIR OUTPUT
set -eu
deps_stamp=$1 wheel=$2 image=$3 output=$4

staging=$output.d
rm -rf "$staging"
mkdir -p "$staging/etc/systemd/system" "$staging/etc/default" "$staging/etc/tmpfiles.d"
"$image/scripts/venv.sh" "$deps_stamp" "$wheel" "$staging/opt/guestagent"
install -m 644 "$image/guestagent.service" "$staging/etc/systemd/system/guestagent.service"
install -m 644 "$image/guestagent.default" "$staging/etc/default/guestagent"
install -m 644 "$image/guestagent.tmpfiles" "$staging/etc/tmpfiles.d/guestagent.conf"

# Only the files the bundle owns: unpacking must not reset the modes of /etc or /opt.
(cd "$staging" && find opt/guestagent etc/systemd/system/guestagent.service etc/default/guestagent \
    etc/tmpfiles.d/guestagent.conf |
    LC_ALL=C sort |
    tar --create --no-recursion --files-from=- --numeric-owner --owner=0 --group=0 \
        --mtime=@0 --format=gnu) | gzip -9 -n > "$output.partial"
mv "$output.partial" "$output"
echo "bundle.sh: $output: $(stat -c %s "$output") bytes packed," \
    "$(du -sb --apparent-size "$staging" | cut -f1) bytes unpacked"
rm -rf "$staging"
