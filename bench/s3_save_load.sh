#!/usr/bin/env bash
# The same checkpoint saved and loaded on local disk and on an S3-protocol
# server on loopback (moto_server), against the AWS CLI moving the same
# bytes to and from the same server.
#
#   bash bench/s3_save_load.sh [MIB] [REPS] [DIR]     (defaults: 256 5 /tmp/bench-s3)
#
# Needs moto_server and aws (the pyenv python3 of this project's machines).
# A distckpt checkpoint of MIB MiB of fp32 tensors (16 MiB each) is made in
# DIR/ckpt-MIB. moto serves a ranged GET of a multipart object by assembling
# the object first, so its cost grows with the object's size: the absolute
# speeds measure moto (one Python process); the ratios compare the clients. Each repetition times, alternating which runs first:
#   save:  distckpt convert DIR/ckpt s3://bench/d-R     aws s3 cp --recursive DIR/ckpt s3://bench/a-R
#   load:  distckpt convert s3://bench/d-R DIR/out      aws s3 cp --recursive s3://bench/a-R DIR/out
#   local: distckpt convert DIR/ckpt DIR/out            (the same save, to local disk)
# (convert streams: every byte read, checksum-verified and written once;
# the load direction writes to local disk like the CLI's download.) Prints
# each time, the medians, the ratios (AWS CLI time / distckpt time: >= 1 is
# distckpt faster), the CPU seconds of client and server in REPS more saves
# of each, and the peak RSS of each distckpt command.
set -euo pipefail
MIB=${1:-256} REPS=${2:-5} DIR=${3:-/tmp/bench-s3}
BIN=${DISTCKPT_BIN:-$(cd "$(dirname "$0")/.." && pwd)/build/bin}
command -v moto_server >/dev/null && command -v aws >/dev/null || { echo "needs moto_server and aws"; exit 2; }
mkdir -p "$DIR"

PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
moto_server -H 127.0.0.1 -p "$PORT" >"$DIR/moto.log" 2>&1 &
MOTO=$!
trap 'kill $MOTO 2>/dev/null; rm -rf "$DIR/out" "$DIR/local"' EXIT
export AWS_ENDPOINT_URL_S3=http://127.0.0.1:$PORT AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench AWS_REGION=us-east-1
export AWS_ENDPOINT_URL=$AWS_ENDPOINT_URL_S3 OMP_NUM_THREADS=1
for _ in $(seq 100); do aws s3 mb s3://bench >/dev/null 2>&1 && break; sleep 0.2; done

if [ ! -d "$DIR/ckpt-$MIB" ]; then
  /usr/bin/python3 -c "
import collections, sys, torch
sd = collections.OrderedDict((f'layers.{i}.weight', torch.randn(2048, 2048)) for i in range($MIB // 16))
torch.save(sd, sys.argv[1])" "$DIR/model.pt"
  "$BIN/distckpt" convert "$DIR/model.pt" "$DIR/ckpt-$MIB" --to distckpt --quiet
  rm -f "$DIR/model.pt"
fi
CKPT=$DIR/ckpt-$MIB
BYTES=$(du -sb "$CKPT" | cut -f1)

seconds() { local t0 t1; t0=$(date +%s.%N); "$@" >/dev/null 2>&1; t1=$(date +%s.%N); echo "$t1 - $t0" | bc -l; }
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
d_save() { "$BIN/distckpt" convert "$CKPT" "s3://bench/d-$1" --to distckpt --quiet; }
a_save() { aws s3 cp --recursive --quiet "$CKPT" "s3://bench/a-$1"; }
d_load() { rm -rf "$DIR/out"; "$BIN/distckpt" convert "s3://bench/d-$1" "$DIR/out" --to distckpt --quiet; }
a_load() { rm -rf "$DIR/out"; aws s3 cp --recursive --quiet "s3://bench/a-$1" "$DIR/out"; }
d_local() { rm -rf "$DIR/local"; "$BIN/distckpt" convert "$CKPT" "$DIR/local" --to distckpt --quiet; }
drop() { aws s3 rm --recursive --quiet "s3://bench/$1" >/dev/null; }  # moto holds objects in memory

ds=() as=() dl=() al=() lo=()
for ((r = 0; r < REPS; ++r)); do
  if ((r % 2 == 0)); then
    ds+=("$(seconds d_save "$r")"); as+=("$(seconds a_save "$r")")
    dl+=("$(seconds d_load "$r")"); al+=("$(seconds a_load "$r")")
  else
    as+=("$(seconds a_save "$r")"); ds+=("$(seconds d_save "$r")")
    al+=("$(seconds a_load "$r")"); dl+=("$(seconds d_load "$r")")
  fi
  lo+=("$(seconds d_local)")
  drop "d-$r"; drop "a-$r"
done
# Where a save's time goes: CPU seconds of the client (user + system) and
# of moto (its utime + stime before and after), one pair per save.
moto_cpu() { awk '{ print ($14 + $15) / 100 }' "/proc/$MOTO/stat"; }
cpu_split() {
  local m0 t; m0=$(moto_cpu)
  t=$( { TIMEFORMAT='%U %S'; time "$@" >/dev/null 2>&1; } 2>&1 )
  printf '%.2f/%.2f' "$(echo "$t" | awk '{ print $1 + $2 }')" "$(echo "$(moto_cpu) - $m0" | bc -l)"
}
dc=() ac=()
for ((r = 0; r < REPS; ++r)); do
  dc+=("$(cpu_split d_save "c$r")"); ac+=("$(cpu_split a_save "c$r")")
  drop "d-c$r"; drop "a-c$r"
done
m() { printf '%s\n' "$@" | median; }
mds=$(m "${ds[@]}") mas=$(m "${as[@]}") mdl=$(m "${dl[@]}") mal=$(m "${al[@]}") mlo=$(m "${lo[@]}")
rss() { /usr/bin/time -f %M "$@" 2>&1 >/dev/null | tail -1; }
save_rss=$(rss "$BIN/distckpt" convert "$CKPT" s3://bench/rss --to distckpt --quiet)
rm -rf "$DIR/out"
load_rss=$(rss "$BIN/distckpt" convert s3://bench/rss "$DIR/out" --to distckpt --quiet)
printf 'checkpoint: %s (%s bytes), %s repetitions, endpoint %s (moto_server, in memory)\n' "$CKPT" "$BYTES" "$REPS" "$AWS_ENDPOINT_URL_S3"
printf 'save s:  distckpt %s | aws %s\n' "${ds[*]}" "${as[*]}"
printf 'load s:  distckpt %s | aws %s\n' "${dl[*]}" "${al[*]}"
printf 'local s: distckpt %s\n' "${lo[*]}"
printf 'save cpu s (client/moto): distckpt %s | aws %s\n' "${dc[*]}" "${ac[*]}"
mib() { echo "$BYTES / 1048576 / $1" | bc -l; }
printf 'median save: distckpt %.2f s (%.0f MiB/s), aws %.2f s (%.0f MiB/s): %.2fx the AWS CLI\n' \
  "$mds" "$(mib "$mds")" "$mas" "$(mib "$mas")" "$(echo "$mas / $mds" | bc -l)"
printf 'median load: distckpt %.2f s (%.0f MiB/s), aws %.2f s (%.0f MiB/s): %.2fx the AWS CLI\n' \
  "$mdl" "$(mib "$mdl")" "$mal" "$(mib "$mal")" "$(echo "$mal / $mdl" | bc -l)"
printf 'median local save: %.2f s (%.0f MiB/s)\n' "$mlo" "$(mib "$mlo")"
printf 'peak RSS: save to S3 %d MiB, load from S3 %d MiB\n' $((save_rss / 1024)) $((load_rss / 1024))
