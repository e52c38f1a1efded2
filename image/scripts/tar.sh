#!/bin/sh
# A tar of PATHs under DIR (and what is under them) on stdout, the same bytes from the same
# files: sorted, owned by root, with fixed mtimes. Only the paths named go in, so a bundle
# unpacked at / does not reset the modes of /etc or /opt.
# Usage: tar.sh DIR PATH...
set -eu
dir=$1
shift
cd "$dir"
find "$@" | LC_ALL=C sort |
    tar --create --no-recursion --files-from=- --numeric-owner --owner=0 --group=0 \
        --mtime=@0 --format=gnu
