#!/usr/bin/env bash
# Generates the Go gRPC code from proto/ and builds the client, in GOPATH mode
# against Debian's Go packages (nothing is downloaded):
#   apt install golang-go protoc-gen-go protoc-gen-go-grpc golang-google-grpc-dev \
#     golang-google-protobuf-dev golang-google-genproto-dev golang-github-golang-protobuf-1-5-dev
# WORK (default: .build/ beside this script) holds the GOPATH; the binary is WORK/client.
# Go's build cache is WORK/cache unless GOCACHE names one (it is keyed by content, so sharing is safe).
# Usage: bash examples/go/build.sh [WORK]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
work="$(mkdir -p "${1:-$here/.build}" && cd "${1:-$here/.build}" && pwd)"
module=typesafeclient
source="$work/src/$module"
mkdir -p "$source"
cd "$root/proto"
protos=$(find typesafe -name '*.proto' | sort)
# The protos carry no go_package: an M option names the Go package of each file.
opts=()
for file in $protos; do
  opts+=("--go_opt=M$file=$module/gen/$(dirname "$file")" "--go-grpc_opt=M$file=$module/gen/$(dirname "$file")")
done
protoc -I . --go_out="$source" --go-grpc_out="$source" \
  --go_opt=module=$module --go-grpc_opt=module=$module "${opts[@]}" $protos
cp "$here/main.go" "$source/main.go"
cd "$source"
GO111MODULE=off GOPATH="$work:/usr/share/gocode" GOCACHE="${GOCACHE:-$work/cache}" HOME="$work" go build -o "$work/client" .
echo "$work/client"
