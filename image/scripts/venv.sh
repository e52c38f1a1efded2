#!/bin/sh
# Build the agent's self-contained venv for a guest whose python3 is /usr/bin/python3 (CPython
# 3.11, as Debian 12's): the pinned dependency tree, the agent wheel, console scripts pointing at
# the venv, host-only code removed, everything byte-compiled. Both the test images and the
# bundle are built from it, so what the VM tests run is what an operator installs.
# Usage: venv.sh DEPS_STAMP WHEEL DEST [INSTALL_PATH]
# (DEPS_STAMP holds the cached dependency tree's path; DEST is where the venv is written, and
# INSTALL_PATH, /opt/guestagent by default, where it will live in the guest)
set -eu
deps=$(cat "$1") wheel=$2 dest=$3 install_path=${4:-/opt/guestagent}
guest_python=/usr/bin/python3
guest_python_version=3.11

# The bytecode and the venv's layout are for one CPython minor version: build with the same.
host_version=$($guest_python -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [ "$host_version" != "$guest_python_version" ]; then
    echo "venv.sh: $guest_python is $host_version; the guest's is $guest_python_version" >&2
    exit 1
fi

site=$dest/lib/python$guest_python_version/site-packages
rm -rf "$dest"
mkdir -p "$dest/bin" "$site"
printf 'home = /usr/bin\ninclude-system-site-packages = false\nversion = %s\n' \
    "$guest_python_version" > "$dest/pyvenv.cfg"
ln -s "$guest_python" "$dest/bin/python"
ln -s python "$dest/bin/python3"
cp -a "$deps/." "$site/"
$guest_python -m pip install --quiet --disable-pip-version-check --no-compile --no-deps \
    --root-user-action=ignore --target "$site" "$wheel"
for script in "$site/bin/"*; do
    sed "1s|^#!.*|#!$install_path/bin/python|" "$script" > "$dest/bin/${script##*/}"
    chmod 755 "$dest/bin/${script##*/}"
done
rm -rf "$site/bin"

# The QEMU harness, the overhead measurement and VM sizing run on the host: never in a guest
# (guestctl imports sizing only for `plan`, measure only for `measure-overhead`).
rm -rf "$site/guestagent/vm" "$site/guestagent/host/measure.py" "$site/guestagent/host/sizing"

# A guest's root disk is often read-only or a throwaway snapshot, so bytecode written at run
# time would be lost at every boot (or never written): compile it here, as unchecked-hash pycs
# that stay valid whatever mtimes unpacking an archive gives the sources.
$guest_python -m compileall -q -j 0 --invalidation-mode unchecked-hash \
    -s "$dest" -p "$install_path" "$dest/lib"
