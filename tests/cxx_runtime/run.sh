#!/usr/bin/env bash
# cmake/DistckptCxxRuntime.cmake against a library that exports part of
# libstdc++: the hazard is real without its option (the library's copy runs)
# and gone with it (libstdc++'s runs).
# Usage: run.sh SOURCE_DIR [CMAKE [GENERATOR]]
set -euo pipefail
work=$(mktemp -d "${TMPDIR:-/tmp}/distckpt-cxx-runtime.XXXXXX")
trap 'rm -rf "$work"' EXIT
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cmake=${2:-cmake}
"$cmake" -S "$here" -B "$work/build" -G "${3:-Ninja}" -DDISTCKPT_SOURCE_DIR="$1" >"$work/configure.log" 2>&1 ||
  { cat "$work/configure.log"; exit 1; }
grep -o 'distckpt: .*exports parts of libstdc++.*' "$work/configure.log"
"$cmake" --build "$work/build" >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
export LD_LIBRARY_PATH="$work/build"
rc=0; "$work/build/plain" "$work/tree" || rc=$?
[ "$rc" = 3 ] || { echo "plain: expected the library's copy (exit 3), got exit $rc"; exit 1; }
"$work/build/fixed" "$work/tree"
readelf -d "$work/build/fixed" | grep -m 1 NEEDED
echo "cxx runtime first: OK"
