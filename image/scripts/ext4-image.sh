#!/bin/sh
# Write a staged root directory as an ext4 image with mkfs.ext4 -d (no loop mount), leaving a
# quarter of free space (plus 64 MiB) for logs, swap files and test data, then remove the
# staging directory.
# Usage: ext4-image.sh STAGING LABEL OUTPUT
set -eu
staging=$1 label=$2 output=$3

used_mib=$(du -sm "$staging" | cut -f1)
rm -f "$output.partial"
truncate -s "$((used_mib * 5 / 4 + 64))M" "$output.partial"
mkfs.ext4 -q -L "$label" -d "$staging" "$output.partial"
mv "$output.partial" "$output"
rm -rf "$staging"
