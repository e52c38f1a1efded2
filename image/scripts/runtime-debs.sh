#!/bin/sh
# Download the Debian packages the agent's runtime is taken from (image/runtime-packages.txt,
# at the versions apt resolves now) and unpack them into one cached tree, keyed by the exact
# versions, so the same versions give the same tree. versions.txt in it names them.
# Prints the tree's path to OUTPUT (a stamp file, so make sees build-tree mtimes).
# Usage: runtime-debs.sh PACKAGES_FILE CACHE_DIR OUTPUT [ARCH]
set -eu
packages_file=$1 cache=$2 output=$3 arch=${4:-amd64}

packages=$(grep -v '^#' "$packages_file" | while read -r package; do
    [ -n "$package" ] && echo "$package"
done)
# One apt-cache call for them all: each call loads apt's cache, 1.5 s here, which made a call
# a package 24 s of every build of the runtime.
shown=$(apt-cache show --no-all-versions $(for package in $packages; do echo "$package:$arch"; done) \
    2>/dev/null | awk '/^Package:/ {name = $2} /^Version:/ {print name, $2}')
versions=$(for package in $packages; do
    version=$(echo "$shown" | awk -v name="$package" '$1 == name {print $2; exit}')
    [ -n "$version" ] || { echo "runtime-debs.sh: cannot resolve $package:$arch; run apt-get update" >&2; exit 1; }
    echo "$package $version"
done)
key=$( (echo "$versions"; echo "$arch"; cat "$0") | sha256sum | cut -c1-16)
tree=$cache/runtime-debs-$key

if [ ! -d "$tree" ]; then
    debs=$cache/debs
    mkdir -p "$debs"
    partial=$tree.partial-$$
    rm -rf "$partial" && mkdir -p "$partial/root"
    echo "$versions" | while read -r package version; do
        file=$(ls "$debs/${package}_"*"_$arch.deb" 2>/dev/null | grep -F "_$(echo "$version" | sed 's/:/%3a/')_" || true)
        if [ -z "$file" ]; then
            (cd "$debs" && apt-get download -q -o APT::Sandbox::User=root "$package:$arch=$version" >/dev/null)
            file=$(ls "$debs/${package}_"*"_$arch.deb" | grep -F "_$(echo "$version" | sed 's/:/%3a/')_")
        fi
        dpkg-deb -x "$file" "$partial/root"
    done
    echo "$versions" > "$partial/versions.txt"
    mv "$partial" "$tree"
fi
echo "$tree" > "$output"
