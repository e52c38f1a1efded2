#!/bin/sh
# Build the Go client (tests/go/client) from protos/ alone, with Debian's Go packages only:
# no module downloads (GOPATH mode over /usr/share/gocode, GOPROXY off), as in a CI without a
# proxy. The code is generated where the proto's go_package says, in a GOPATH of its own.
# Usage: tests/go/build.sh OUTPUT_BINARY [WORK_DIR]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=$1
work=${2:-$(mktemp -d)}
mkdir -p "$work/src"
protoc -I"$repo/protos" --go_out="$work/src" --go-grpc_out="$work/src" \
    "$repo/protos/guestagent/v1/agent.proto"
mkdir -p "$work/src/guestagent-client"
cp "$here/client/main.go" "$work/src/guestagent-client/"
cd "$work/src/guestagent-client"
GOPATH="$work:/usr/share/gocode" GO111MODULE=off GOPROXY=off GOFLAGS= GOCACHE="$work/cache" \
    go build -o "$out" .
