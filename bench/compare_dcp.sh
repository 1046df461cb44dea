#!/usr/bin/env bash
# distckpt next to PyTorch's distributed checkpoint (DCP), same state, same
# rank count, same file system, one after the other in one run:
#
#   bash bench/compare_dcp.sh -n NRANKS [--mb 2048] [--reps 3] [--dir /tmp/dcb]
#
# Prints both benchmarks' tables, then the ratios (DCP time / distckpt time:
# above 1 means distckpt is faster).
set -euo pipefail
cd "$(dirname "$0")/.."
nranks=1 mb=2048 reps=3 dir=/tmp/dcb
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
trap 'rm -f "$out"' EXIT
if [[ "$nranks" == 1 ]]; then
  "$BIN/save_load_bench" --mb "$mb" --reps "$reps" --dir "$dir" | tee -a "$out"
else
  "$BIN/distckpt-launch" -n "$nranks" -- "$BIN/save_load_bench" --mb "$mb" --reps "$reps" --dir "$dir" | tee -a "$out"
fi
bash bench/dcp_baseline.sh -n "$nranks" -- --mb "$mb" --reps "$reps" --dir "$dir-dcp" | tee -a "$out"
python3 - "$out" <<'PY'
import re, sys
fields = {}
for line in open(sys.argv[1]):
    if line.startswith("RESULT"):
        fields.update(dict(kv.split("=") for kv in line.split()[1:]))
f = {k: float(v) for k, v in fields.items()}
print(f"\n| ranks {int(f['ranks'])}, {f['gb']:.2f} GB | distckpt s | DCP s | distckpt faster by |\n|---|---|---|---|")
for name, ours, theirs in [("save (committed, fsync'd)", "save_s", "dcp_save_s"),
                           ("load, same layout", "load_s", "dcp_load_s"),
                           ("load, resharded (rows -> columns)", "reshard_load_s", "dcp_reshard_load_s")]:
    print(f"| {name} | {f[ours]:.3f} | {f[theirs]:.3f} | {f[theirs] / f[ours]:.2f}x |")
PY
