#!/usr/bin/env bash
# Generates the code from proto/ into OUT (default: gen/ beside this script),
# then runs client.py with the interpreter Debian's python3-grpcio belongs to
# (/usr/bin/python3; TYPESAFE_PYTHON overrides). `npm run example:python` and
# the polyglot test both run this script, so they run the same Python.
# Usage: TYPESAFE_URL=… TYPESAFE_KEY=… bash examples/python/run.sh [OUT]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="$(bash "$here/generate.sh" "${1:-$here/gen}")"
exec "${TYPESAFE_PYTHON:-/usr/bin/python3}" "$here/client.py" "$out"
