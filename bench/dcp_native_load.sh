#!/usr/bin/env bash
# A PyTorch DCP checkpoint written by PyTorch itself (torch 1.13's
# FileSystemWriter, one file per rank, bench/dcp_baseline.py), loaded by
# PyTorch's own FileSystemReader and by distckpt's C++ reader of the DCP
# format (bench/save_load_bench.cpp --from), same state, same ranks, same
# layouts (the saving row shards, and columns), one after the other in one
# run; with the raw read of the same bytes measured in that run too.
#
#   bash bench/dcp_native_load.sh -n NRANKS [--mb 1024] [--reps 3] [--dir /tmp/dnl]
#
# Prints both tables, then the ratios (above 1: distckpt is faster).
set -euo pipefail
cd "$(dirname "$0")/.."
nranks=1 mb=1024 reps=3 dir=/tmp/dnl
while [[ $# -gt 0 ]]; do
  case "$1" in
    -n) nranks="$2"; shift 2 ;;
    --mb) mb="$2"; shift 2 ;;
    --reps) reps="$2"; shift 2 ;;
    --dir) dir="$2"; shift 2 ;;
    *) echo "usage: $0 -n NRANKS [--mb MB] [--reps N] [--dir DIR]" >&2; exit 2 ;;
  esac
done
BIN=${BUILD_DIR:-build}/bin
export OMP_NUM_THREADS=1
out=$(mktemp)
trap 'rm -f "$out"; rm -rf "$dir" "$dir-raw"' EXIT
bash bench/dcp_baseline.sh -n "$nranks" -- --mb "$mb" --reps "$reps" --dir "$dir" --keep | tee -a "$out"
launch=()
[[ "$nranks" == 1 ]] || launch=("$BIN/distckpt-launch" -n "$nranks" --)
"${launch[@]}" "$BIN/save_load_bench" --from "$dir/ckpt" --mb "$mb" --reps "$reps" --dir "$dir-raw" | tee -a "$out"
python3 - "$out" <<'PY'
import sys
f = {}
for line in open(sys.argv[1]):
    if line.startswith("RESULT"):
        f.update(dict(kv.split("=") for kv in line.split()[1:]))
f = {k: float(v) for k, v in f.items() if v != "n/a"}
print(f"\n| ranks {int(f['ranks'])}, {f['gb']:.2f} GB, PyTorch's DCP checkpoint | PyTorch s | distckpt s | "
      f"distckpt vs PyTorch | distckpt vs raw read |\n|---|---|---|---|---|")
for name, ours, theirs in [("load, same layout (rows)", "load_s", "dcp_load_s"),
                           ("load, resharded (rows -> columns)", "reshard_load_s", "dcp_reshard_load_s")]:
    print(f"| {name} | {f[theirs]:.3f} | {f[ours]:.3f} | {f[theirs] / f[ours]:.2f}x | {f['raw_read_s'] / f[ours]:.2f}x |")
PY
