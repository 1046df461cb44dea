#!/usr/bin/env bash
# The main demo: save with 4 ranks under (tp=2, pp=2), load under (tp=1, pp=2)
# with 2 ranks and under (tp=4, pp=2) with 8 ranks, checking every value;
# then save again from another layout and compare layout-independent digests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh distckpt_demo distckpt_cli distckpt_launch
BIN=${BUILD_DIR:-build}/bin
WORK=$(mktemp -d "${TMPDIR:-/tmp}/distckpt-demo-XXXXXX")
trap 'rm -rf "$WORK"' EXIT
export OMP_NUM_THREADS=1

step() { printf '\n== %s\n' "$*"; }
step "save: 4 ranks, tp=2 pp=2"
"$BIN/distckpt-launch" -n 4 -- "$BIN/distckpt-demo" --tp 2 --pp 2 --save "$WORK/ckpt"
step "inspect"
"$BIN/distckpt" inspect "$WORK/ckpt"
step "verify"
"$BIN/distckpt" verify "$WORK/ckpt"
step "load: 2 ranks, tp=1 pp=2"
"$BIN/distckpt-launch" -n 2 -- "$BIN/distckpt-demo" --tp 1 --pp 2 --load "$WORK/ckpt"
step "load: 8 ranks, tp=4 pp=2"
"$BIN/distckpt-launch" -n 8 -- "$BIN/distckpt-demo" --tp 4 --pp 2 --load "$WORK/ckpt"
step "save the same model from 4 ranks, tp=4 pp=1, and compare digests"
"$BIN/distckpt-launch" -n 4 -- "$BIN/distckpt-demo" --tp 4 --pp 1 --save "$WORK/ckpt2"
"$BIN/distckpt" digest "$WORK/ckpt" | tee "$WORK/a.digest"
"$BIN/distckpt" digest "$WORK/ckpt2" > "$WORK/b.digest"
diff "$WORK/a.digest" "$WORK/b.digest"
echo "digests equal: the same logical state under two layouts"
