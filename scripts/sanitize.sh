#!/usr/bin/env bash
# Builds distckpt and its test suite under sanitizers (gcc) and runs it.
#   scripts/sanitize.sh [asan] [CTEST_REGEX]   ASan + UBSan, ./build-asan, the whole suite by default
#   scripts/sanitize.sh tsan [CTEST_REGEX]     TSan, ./build-tsan, the threaded I/O, async and exchange tests
# LibTorch, Gloo and the rest of Debian are not instrumented; what that needs
# is in tests/sanitizers/*.supp, one reason per entry.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
mode=${1:-asan}
case "$mode" in
  asan)
    BUILD_DIR=${BUILD_DIR:-build-asan}
    flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
    regex=${2:-.}
    ;;
  tsan)
    BUILD_DIR=${BUILD_DIR:-build-tsan}
    flags="-fsanitize=thread -fno-omit-frame-pointer"
    # Writer threads and buffer pools, async saves, the exchange engine (loads
    # and local checkpoints), the Gloo communicator, loads from safetensors.
    regex=${2:-'^(IoThreads|BufferPool|FileWriteJob|AsyncSave|ExchangeEngine|FullyParallelLoad|LocalCheckpoint|CommGlooTest|Safetensors)'}
    ;;
  *)
    echo "usage: $0 [asan|tsan] [CTEST_REGEX]" >&2
    exit 2
    ;;
esac
supp="$PWD/tests/sanitizers"

export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  # -O1: sanitized code at full optimisation builds slowly and reports less precisely.
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDISTCKPT_BUILD_BENCH=OFF \
    -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" \
    -DCMAKE_EXE_LINKER_FLAGS="$flags" -DCMAKE_SHARED_LINKER_FLAGS="$flags" >/dev/null
fi
nice -n 10 cmake --build "$BUILD_DIR" -j "$(nproc)"

jobs=$(nproc)  # before OMP_NUM_THREADS, which nproc obeys
export OMP_NUM_THREADS=1
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:strict_init_order=1"
export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$supp/ubsan.supp"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$supp/tsan.supp"
# The outside-project test reinstalls and rebuilds against the package: no
# sanitizer flags there, nothing of ours to check. SANITIZE_EXCLUDE: a ctest
# regex of tests to leave out (e.g. the slow e2e suites on a small machine).
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$jobs" --timeout 1200 -R "$regex" \
  -E "${SANITIZE_EXCLUDE:-^outside_project_find_package$}"
