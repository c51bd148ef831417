#!/usr/bin/env bash
# Soak test of `lockstep serve` at CI size: tests/serve/soak.py sends a real
# server on loopback valid requests mixed with abuse (malformed, huge and
# deeply nested bodies, wrong types, dropped streams, slow and idle clients,
# weight updates during traffic) and checks answers, memory, fds and threads.
# SOAK_REQUESTS=20000 runs the long size by hand (docs/server.md).
set -euo pipefail
BIN=$1
SRC=$2
exec python3 "$SRC/tests/serve/soak.py" "$BIN"
