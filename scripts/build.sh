#!/usr/bin/env bash
# Configures and builds distckpt into ./build (Ninja, ccache when present).
# Arguments name targets to build (default: everything).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
BUILD_DIR=${BUILD_DIR:-build}
# DISTCKPT_PCH=OFF builds without the precompiled header (CI does: every file
# must include what it uses).
PCH=${DISTCKPT_PCH:-ON}
# ccache: compile commands are relative to the checkout, so clones and
# worktrees share cache entries; the precompiled header needs the sloppiness.
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDISTCKPT_PCH="$PCH"
else
  cmake "$BUILD_DIR" -DDISTCKPT_PCH="$PCH" >/dev/null
fi
# (nproc obeys OMP_NUM_THREADS, which the test commands set to 1)
jobs=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
if [ $# -gt 0 ]; then
  cmake --build "$BUILD_DIR" -j "$jobs" --target "$@"
else
  cmake --build "$BUILD_DIR" -j "$jobs"
fi
