#!/usr/bin/env bash
# torch.save file -> safetensors (or torch.save, or distckpt), against a
# plain copy of the same file.
#
#   bash bench/torch_file_export.sh [GIB] [REPS] [DIR] [TO]
#   (defaults: 1 5 /tmp/bench-torch-file safetensors; TO: safetensors, torch or distckpt)
#
# Python's torch.save writes GIB GiB of fp32 tensors (64 MiB each) to
# DIR/model.pt. Each repetition evicts the file from the page cache, then
# times `distckpt convert model.pt out --to TO` (which checks every
# CRC-32 and fsyncs) and `dd` copying the file in 32 MiB blocks with fsync,
# alternating which runs first. Prints each time, the medians and their
# ratio, and the peak RSS of the conversion against `distckpt inspect` of
# what it wrote (the same binary, nothing read).
set -euo pipefail
GIB=${1:-1} REPS=${2:-5} DIR=${3:-/tmp/bench-torch-file} TO=${4:-safetensors}
BIN=${DISTCKPT_BIN:-$(cd "$(dirname "$0")/.." && pwd)/build/bin}
mkdir -p "$DIR"
if [ ! -f "$DIR/model-$GIB.pt" ]; then
  /usr/bin/python3 -c "
import collections, sys, torch
sd = collections.OrderedDict((f'layers.{i}.weight', torch.randn(4096, 4096)) for i in range(16 * $GIB))
torch.save(sd, sys.argv[1])" "$DIR/model-$GIB.pt"
fi
PT=$DIR/model-$GIB.pt

evict() { sync; echo 1 >/proc/sys/vm/drop_caches 2>/dev/null || dd of="$PT" oflag=nocache conv=notrunc,fdatasync count=0 2>/dev/null; }
seconds() { local t0 t1; t0=$(date +%s.%N); "$@" >/dev/null; t1=$(date +%s.%N); echo "$t1 - $t0" | bc -l; }
OUT=$DIR/out.$TO
convert() { rm -rf "$OUT"; "$BIN/distckpt" convert "$PT" "$OUT" --to "$TO" --quiet; }
copy() { rm -f "$DIR/copy.pt"; dd if="$PT" of="$DIR/copy.pt" bs=32M conv=fsync status=none; }
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

conv_times=() copy_times=()
for ((r = 0; r < REPS; ++r)); do
  if ((r % 2 == 0)); then
    evict; conv_times+=("$(seconds convert)"); sleep 2
    evict; copy_times+=("$(seconds copy)")
  else
    evict; copy_times+=("$(seconds copy)"); sleep 2
    evict; conv_times+=("$(seconds convert)")
  fi
  sleep 2
done
conv=$(printf '%s\n' "${conv_times[@]}" | median)
raw=$(printf '%s\n' "${copy_times[@]}" | median)
rss() { /usr/bin/time -f %M "$@" 2>&1 >/dev/null | tail -1; }
rm -rf "$OUT"
convert_rss=$(rss "$BIN/distckpt" convert "$PT" "$OUT" --to "$TO" --quiet)
inspect_rss=$(rss "$BIN/distckpt" inspect "$OUT")
printf 'file: %s (%s bytes) -> %s\n' "$PT" "$(stat -c %s "$PT")" "$TO"
printf 'convert s: %s\ncopy s:    %s\n' "${conv_times[*]}" "${copy_times[*]}"
printf 'median: convert %.2f s / copy %.2f s = %.2f\n' "$conv" "$raw" "$(echo "$conv / $raw" | bc -l)"
printf 'peak RSS: convert %d MiB, inspect %d MiB\n' $((convert_rss / 1024)) $((inspect_rss / 1024))
rm -rf "$OUT" "$DIR/copy.pt"
