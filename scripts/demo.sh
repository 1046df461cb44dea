#!/usr/bin/env bash
# The main demo.
# 1. A small GPT, checkpointed through the API generated from
#    schema/models/gpt.shard: train 3 steps with 4 ranks (tp=2, pp=2), save;
#    load with 8 ranks (tp=4, pp=2), save again; the digests match.
# 2. A hand-built sharded state dict (tensors over a 2-D mesh, replicated
#    tensors, objects, common values): saved with 4 ranks, loaded with 2 and 8
#    ranks under other meshes, every value checked.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh distckpt_gpt_trainer distckpt_demo distckpt_cli distckpt_launch
BIN=${BUILD_DIR:-build}/bin
WORK=$(mktemp -d "${TMPDIR:-/tmp}/distckpt-demo-XXXXXX")
trap 'rm -rf "$WORK"' EXIT
export OMP_NUM_THREADS=1
step() { printf '\n== %s\n' "$*"; }
MODEL="--model gpt --layers 4 --hidden 64 --heads 8 --kv-groups 2 --ffn 128 --vocab 256"

step "GPT: train 3 steps with 4 ranks (tp=2 pp=2) and save"
"$BIN/distckpt-launch" -n 4 -- "$BIN/distckpt-gpt-trainer" $MODEL --tp 2 --pp 2 --steps 3 --save "$WORK/gpt_a"
"$BIN/distckpt" inspect "$WORK/gpt_a"
step "GPT: load with 8 ranks (tp=4 pp=2) and save again"
"$BIN/distckpt-launch" -n 8 -- "$BIN/distckpt-gpt-trainer" $MODEL --tp 4 --pp 2 --load "$WORK/gpt_a" --save "$WORK/gpt_b"
step "GPT: digests of both checkpoints (layout-independent)"
"$BIN/distckpt" digest "$WORK/gpt_a" | tee "$WORK/a.digest"
"$BIN/distckpt" digest "$WORK/gpt_b" > "$WORK/b.digest"
diff "$WORK/a.digest" "$WORK/b.digest"
echo "digests equal: the same model under tp=2,pp=2 and tp=4,pp=2"

step "hand-built state dict: save with 4 ranks (tp=2 pp=2)"
"$BIN/distckpt-launch" -n 4 -- "$BIN/distckpt-demo" --tp 2 --pp 2 --save "$WORK/ckpt"
"$BIN/distckpt" verify "$WORK/ckpt"
step "hand-built state dict: load with 2 ranks (tp=1 pp=2)"
"$BIN/distckpt-launch" -n 2 -- "$BIN/distckpt-demo" --tp 1 --pp 2 --load "$WORK/ckpt"
step "hand-built state dict: load with 8 ranks (tp=4 pp=2)"
"$BIN/distckpt-launch" -n 8 -- "$BIN/distckpt-demo" --tp 4 --pp 2 --load "$WORK/ckpt"
