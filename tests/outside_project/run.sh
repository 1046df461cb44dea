#!/usr/bin/env bash
# Proves that an outside project can use an installed distckpt:
#   1. cmake --install BUILD_DIR into a fresh temporary prefix,
#   2. configure tests/outside_project from a fresh temporary build directory
#      with only that prefix on CMAKE_PREFIX_PATH (find_package(distckpt) +
#      distckpt_generate()), build it,
#   3. run it (save + load through the generated layout) and run the installed
#      `distckpt verify` on its checkpoint.
# Usage: run.sh BUILD_DIR   (a built distckpt build directory)
set -euo pipefail

fail() {
  echo "outside_project: FAILED: $*" >&2
  exit 1
}

[[ $# -eq 1 ]] || { echo "usage: $0 BUILD_DIR" >&2; exit 2; }
build_dir=$(cd "$1" && pwd) || fail "no build directory '$1'"
source_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo_dir=$(cd "$source_dir/../.." && pwd)

prefix=$(mktemp -d "${TMPDIR:-/tmp}/distckpt-prefix.XXXXXX")
work=$(mktemp -d "${TMPDIR:-/tmp}/distckpt-outside.XXXXXX")
trap 'rm -rf "$prefix" "$work"' EXIT

echo "== install $build_dir -> $prefix"
cmake --install "$build_dir" --prefix "$prefix" >"$work/install.log" 2>&1 ||
  { cat "$work/install.log" >&2; fail "cmake --install (is the whole project built?)"; }

# The package must not point back into the build or source tree.
if grep -rqF -e "$build_dir" -e "$repo_dir" "$prefix/lib/cmake/distckpt"; then
  grep -rnF -e "$build_dir" -e "$repo_dir" "$prefix/lib/cmake/distckpt" >&2
  fail "installed package files refer to the build or source tree"
fi

echo "== configure + build the outside project in $work/build"
# No package registry: only the fresh prefix may provide distckpt.
cmake -S "$source_dir" -B "$work/build" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF || fail "configuring the outside project"
found=$(sed -n 's/^distckpt_DIR:PATH=//p' "$work/build/CMakeCache.txt")
[[ $found == "$prefix"/* ]] || fail "find_package(distckpt) found '$found', not the installed package in $prefix"
cmake --build "$work/build" -j2 || fail "building the outside project"

echo "== run"
"$work/build/outside_project" "$work/ckpt" || fail "the outside project's binary"
"$prefix/bin/distckpt" verify "$work/ckpt" || fail "the installed 'distckpt verify'"
if [[ -f "$prefix/include/distckpt/nccl/nccl_communicator.h" ]]; then
  [[ -x "$work/build/outside_nccl" ]] || fail "distckpt::nccl is installed but the outside project did not link it"
  "$work/build/outside_nccl" || fail "the outside project's NCCL binary"
fi
echo "outside_project: passed"
