#!/usr/bin/env bash
# Random single-bit flips over every file of a committed 2-rank checkpoint
# (a GPT with Adam state): counts flips the load rejected, flips that left
# the loaded state unchanged, and silent ones (must be 0), and checks that
# `verify` rejects every checkpoint the load rejected.
#   scripts/bitflip.sh [TRIALS=1000] [SEED=1]      (uses ./build; BUILD_DIR to change)
# Writes one JSON line per trial to $REPORT (default: a temporary file).
set -euo pipefail
cd "$(dirname "$0")/.."
TRIALS=${1:-1000}
SEED=${2:-1}
BIN=$(realpath "${BUILD_DIR:-build}")/bin
for tool in distckpt-launch distckpt-gpt-trainer distckpt_bitflip_probe; do
  [ -x "$BIN/$tool" ] || { echo "missing $BIN/$tool: build first (scripts/build.sh)" >&2; exit 2; }
done
WORK=$(mktemp -d "${TMPDIR:-/tmp}/distckpt-bitflip-XXXXXX")
trap 'rm -rf "$WORK"' EXIT
export OMP_NUM_THREADS=1
"$BIN/distckpt-launch" -n 2 -- "$BIN/distckpt-gpt-trainer" --tp 2 --layers 2 --hidden 32 --heads 4 --ffn 64 \
  --vocab 64 --optimizer adam --steps 2 --save "$WORK/pristine" >/dev/null
"$BIN/distckpt-launch" -n 2 -- "$BIN/distckpt_bitflip_probe" --pristine "$WORK/pristine" --work "$WORK" \
  --trials "$TRIALS" --seed "$SEED" --report "${REPORT:-$WORK/report.jsonl}"
