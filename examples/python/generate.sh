#!/usr/bin/env bash
# Generates the Python gRPC code from proto/ into OUT (default: gen/ beside this
# script), with Debian's protoc and gRPC plugin:
#   apt install protobuf-compiler protobuf-compiler-grpc python3-grpcio python3-protobuf
# Usage: bash examples/python/generate.sh [OUT]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="$(mkdir -p "${1:-$here/gen}" && cd "${1:-$here/gen}" && pwd)"
cd "$root/proto"
# Our protos and the google.rpc ones that decode the grpc-status-details-bin trailer.
protoc -I . --python_out="$out" --grpc_python_out="$out" \
  --plugin=protoc-gen-grpc_python=/usr/bin/grpc_python_plugin \
  $(find typesafe google -name '*.proto' | sort)
echo "$out"
