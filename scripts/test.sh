#!/usr/bin/env bash
# Builds everything and runs the whole test suite (unit, multi-rank, e2e).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
BUILD_DIR=${BUILD_DIR:-build}
# Multi-rank tests start several Gloo ranks per process: keep LibTorch's own
# thread pools small on small machines.
export OMP_NUM_THREADS=1
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)" --timeout 600
