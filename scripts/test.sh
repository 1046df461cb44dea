#!/usr/bin/env bash
# Builds everything and runs the whole test suite (unit, multi-rank, e2e).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
BUILD_DIR=${BUILD_DIR:-build}
# Counted before OMP_NUM_THREADS is set: nproc obeys it (with it, every test ran one at a time).
jobs=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
# Multi-rank tests start several Gloo ranks per process: keep LibTorch's own
# thread pools small on small machines.
export OMP_NUM_THREADS=1
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$jobs" --timeout 600
