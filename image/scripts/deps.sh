#!/bin/sh
# Install the agent's pinned dependencies as guest (CPython 3.11, manylinux2014 for MACHINE,
# x86_64 or aarch64) wheels into a cached site-packages tree, reused while requirements.txt
# is unchanged.
# Prints the tree's path to OUTPUT (a stamp file, so make sees build-tree mtimes).
# Usage: deps.sh REQUIREMENTS CACHE_DIR OUTPUT [MACHINE]
set -eu
requirements=$1 cache=$2 output=$3 machine=${4:-x86_64}

key=$( (cat "$requirements" "$0"; echo "$machine") | sha256sum | cut -c1-16)
site=$cache/deps-$key

if [ ! -d "$site" ]; then
    rm -rf "$site.partial-$$"
    /usr/bin/python3 -m pip install --quiet --disable-pip-version-check --no-compile --root-user-action=ignore \
        --target "$site.partial-$$" --platform "manylinux2014_$machine" --python-version 3.11 \
        --implementation cp --abi cp311 --only-binary=:all: -r "$requirements"
    mv "$site.partial-$$" "$site"
fi
echo "$site" > "$output"
