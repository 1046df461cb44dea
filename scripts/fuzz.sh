#!/usr/bin/env bash
# Builds the fuzz targets (tests/fuzz) with clang-16, libFuzzer, ASan and
# UBSan into ./build-fuzz and runs them.
#   scripts/fuzz.sh [TARGET] [SECONDS]   fuzz TARGET (default: each in turn) for SECONDS (default 60)
#   scripts/fuzz.sh merge [TARGET]       minimise the seed corpus plus what runs found into tests/fuzz/corpus
#   scripts/fuzz.sh total                totals of every run so far, per target
# Targets: metadata common_state commit_marker local_file wire schema safetensors torch_pickle zip_archive dcp_metadata.
# A dictionary tests/fuzz/TARGET.dict is used when there is one.
# Inputs found go to build-fuzz/corpus/TARGET, crashes to build-fuzz/crashes/TARGET
# (libFuzzer's slow-unit-* files land there too, but are not counted as crashes);
# each run appends "target seconds executions crashes max_len" to build-fuzz/fuzz-runs.tsv.
# FUZZ_MAX_LEN=N caps the input size (libFuzzer's -max_len; default: the largest seed):
# short inputs run several times faster, which is what the slow schema target needs.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-fuzz}
if [ "${1:-}" = total ]; then
  awk -F'\t' '{ s[$1] += $2; n[$1] += $3; c[$1] += $4 }
    END { for (t in n) printf "%-14s %6.0f s %12d executions %d crashes\n", t, s[t], n[t], c[t] }' \
    "$BUILD_DIR/fuzz-runs.tsv" | sort
  exit 0
fi
[ -n "${FUZZ_NO_BUILD:-}" ] || bash scripts/install-deps.sh
ALL=(metadata common_state commit_marker local_file wire schema safetensors torch_pickle zip_archive dcp_metadata)

mode=run
if [ "${1:-}" = merge ]; then
  mode=merge
  shift
fi
targets=("${ALL[@]}")
if [ $# -gt 0 ] && [ -n "$1" ]; then
  targets=("$1")
fi
seconds=${2:-60}

export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
# FUZZ_NO_BUILD=1: run what is built (e.g. while another build of the tree runs).
if [ -z "${FUZZ_NO_BUILD:-}" ]; then
  if [ ! -f "$BUILD_DIR/build.ninja" ]; then
    CC=clang-16 CXX=clang++-16 cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DDISTCKPT_FUZZ=ON -DDISTCKPT_BUILD_BENCH=OFF -DDISTCKPT_BUILD_EXAMPLES=OFF >/dev/null
  fi
  nice -n 10 cmake --build "$BUILD_DIR" -j "$(nproc)" --target "${targets[@]/#/fuzz_}"
fi

# LibTorch is not instrumented: leaks in its static initialisers are not ours.
# Campaigns trade two costly ASan checks for 1.6x the speed: use-after-return
# (fake stacks; our parsers return values, not pointers into their frames) and
# full allocation stacks in reports. Replay a crash with ASAN_OPTIONS unset
# (tests/fuzz/replay_main.cpp or the target binary) for the whole report.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:detect_stack_use_after_return=0:malloc_context_size=2}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
# Reports name functions and lines when a symbolizer is installed (any LLVM's).
symbolizer=$(command -v llvm-symbolizer-16 || command -v llvm-symbolizer || true)
[ -z "$symbolizer" ] || export ASAN_SYMBOLIZER_PATH=${ASAN_SYMBOLIZER_PATH:-$symbolizer}
for t in "${targets[@]}"; do
  bin="$BUILD_DIR/bin/fuzz/fuzz_$t"
  seeds="tests/fuzz/corpus/$t"
  found="$BUILD_DIR/corpus/$t"
  crashes="$BUILD_DIR/crashes/$t"
  mkdir -p "$found" "$crashes"
  if [ $mode = merge ]; then
    # -merge=1 keeps the smallest inputs that keep all the coverage.
    merged=$(mktemp -d)
    "$bin" -merge=1 -artifact_prefix="$crashes/" "$merged" "$seeds" "$found" 2>"$BUILD_DIR/merge-$t.log"
    # Inputs that once crashed stay, under their names, whatever their coverage.
    for f in "$seeds"/crash-*; do
      [ -f "$f" ] || continue
      rm -f "$merged/$(sha1sum <"$f" | cut -d' ' -f1)"  # the merge names inputs by their SHA-1
      cp "$f" "$merged/"
    done
    rm -rf "$seeds"
    mv "$merged" "$seeds"
    chmod 755 "$seeds"
    echo "fuzz: $t: $(find "$seeds" -type f | wc -l) corpus files, $(du -sh "$seeds" | cut -f1)"
    continue
  fi
  log="$BUILD_DIR/fuzz-$t.log"
  before=$(find "$crashes" -type f ! -name 'slow-unit-*' | wc -l)
  # One process (the machine is shared); a crash ends the run and is kept.
  set +e
  extra=()
  [ ! -f "tests/fuzz/$t.dict" ] || extra+=(-dict="tests/fuzz/$t.dict")
  [ -z "${FUZZ_MAX_LEN:-}" ] || extra+=(-max_len="$FUZZ_MAX_LEN")
  nice -n 19 "$bin" -max_total_time="$seconds" -print_final_stats=1 -artifact_prefix="$crashes/" "${extra[@]}" \
    "$found" "$seeds" >"$log" 2>&1
  rc=$?
  set -e
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
  rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
  new=$(($(find "$crashes" -type f ! -name 'slow-unit-*' | wc -l) - before))
  printf '%s\t%s\t%s\t%s\t%s\n' "$t" "$seconds" "${execs:-0}" "$new" "${FUZZ_MAX_LEN:-seeds}" >>"$BUILD_DIR/fuzz-runs.tsv"
  echo "fuzz: $t: ${execs:-0} executions (${rate:-0}/s) in ${seconds}s, $new crashes (exit $rc, log $log)"
  [ "$new" -eq 0 ] || ls "$crashes" | tail -n "$new" | sed "s|^|  $crashes/|"
done
