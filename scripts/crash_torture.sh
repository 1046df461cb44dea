#!/usr/bin/env bash
# Crash consistency: kill -9 a random rank of a 2-rank save at a random
# instant (its Nth call of a random file-changing syscall, via strace fault
# injection), while it overwrites a committed checkpoint. After every kill:
# the checkpoint directory still verifies and holds exactly the old or the
# new state (by digest), no rank survives, and the next save succeeds.
#   scripts/crash_torture.sh [TRIALS=200] [SEED=1]     (uses ./build; BUILD_DIR to change)
set -euo pipefail
cd "$(dirname "$0")/.."
TRIALS=${1:-200}
SEED=${2:-1}
BIN=$(realpath "${BUILD_DIR:-build}")/bin
command -v strace >/dev/null || { echo "crash_torture: strace is needed (scripts/install-deps.sh)" >&2; exit 2; }
for tool in distckpt distckpt-launch distckpt-gpt-trainer; do
  [ -x "$BIN/$tool" ] || { echo "missing $BIN/$tool: build first (scripts/build.sh)" >&2; exit 2; }
done
WORK=$(mktemp -d "${TMPDIR:-/tmp}/distckpt-torture-XXXXXX")
trap 'rm -rf "$WORK"' EXIT
export OMP_NUM_THREADS=1
RANDOM=$SEED
CKPT=$WORK/ckpt
# Every call a save makes to change files; a kill at any of them is a crash
# at that instant.
SYSCALLS=pwrite64,pwritev,write,fsync,fdatasync,rename,renameat,renameat2,mkdir,unlink,unlinkat,rmdir
TRAINER=("$BIN/distckpt-gpt-trainer" --tp 2 --layers 2 --hidden 32 --heads 4 --ffn 64 --vocab 64 --optimizer adam)

fail() {
  echo "crash_torture: FAILED: $*" >&2
  exit 1
}
# save STEPS DIR [RANK]: a 2-rank save of the state after STEPS steps; with
# RANK, that rank is killed at its Nth call of CALL (environment; N counts
# per thread).
save() {
  local steps=$1 dir=$2 victim=${3:--1}
  timeout -s KILL 180 "$BIN/distckpt-launch" -n 2 -- /bin/sh -c '
    if [ "$RANK" = "$1" ]; then
      shift; exec strace -f -qq -o /dev/null -e trace="$SYSCALLS" -e inject="$CALL":signal=SIGKILL:when="$N" "$@"
    fi
    shift; exec "$@"' sh "$victim" "${TRAINER[@]}" --steps "$steps" --save "$dir" --overwrite
}
export SYSCALLS
# LeakSanitizer cannot run under ptrace (scripts/sanitize.sh builds): off for these jobs.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
digest() { "$BIN/distckpt" digest "$1"; }

# The two states the trials alternate between, and how many of each call a
# rank makes while saving (the range for N).
save 1 "$WORK/ref1" >/dev/null
save 2 "$WORK/ref2" >/dev/null
D1=$(digest "$WORK/ref1")
D2=$(digest "$WORK/ref2")
[ "$D1" != "$D2" ] || fail "the two reference states digest the same"
cp -r "$WORK/ref1" "$CKPT"
cp -r "$WORK/ref1" "$WORK/calibrate"  # calibrate on overwrites, like the trials
declare -A COUNTS
for rank in 0 1; do
  OUT="$WORK/counts$rank" timeout -s KILL 180 "$BIN/distckpt-launch" -n 2 -- /bin/sh -c '
    if [ "$RANK" = "$1" ]; then shift; exec strace -f -c -o "$OUT" -e trace="$SYSCALLS" "$@"; fi
    shift; exec "$@"' sh "$rank" "${TRAINER[@]}" --steps 1 --save "$WORK/calibrate" --overwrite >/dev/null
  while read -r calls name; do COUNTS[$rank:$name]=$calls; done < <(
    awk '$NF ~ /^[a-z0-9_]+$/ && $4 ~ /^[0-9]+$/ && $NF != "total" { print $4, $NF }' "$WORK/counts$rank")
done
for key in $(printf '%s\n' "${!COUNTS[@]}" | sort); do printf 'rank %s: %s calls of %s\n' "${key%%:*}" "${COUNTS[$key]}" "${key#*:}"; done

killed=0 kept_old=0 committed_new=0 survived=0
for ((trial = 1; trial <= TRIALS; trial++)); do
  before=$(digest "$CKPT")
  if [ "$before" = "$D1" ]; then steps=2 after_ok=$D2; else steps=1 after_ok=$D1; fi
  victim=$((RANDOM % 2))
  mapfile -t calls < <(for key in "${!COUNTS[@]}"; do [ "${key%%:*}" = "$victim" ] && echo "${key#*:}"; done | sort)
  call=${calls[RANDOM % ${#calls[@]}]}
  n=$((RANDOM % COUNTS[$victim:$call] + 1))
  rc=0
  CALL=$call N=$n save "$steps" "$CKPT" "$victim" >"$WORK/trial.log" 2>&1 || rc=$?
  if pgrep -f -- "--save $CKPT" >/dev/null; then fail "trial $trial: a rank outlived the job"; fi
  "$BIN/distckpt" verify "$CKPT" >/dev/null 2>&1 || fail "trial $trial (rank $victim, $call #$n): the checkpoint does not verify"
  now=$(digest "$CKPT")
  if [ "$rc" -ne 0 ]; then
    killed=$((killed + 1))
    if [ "$now" = "$before" ]; then kept_old=$((kept_old + 1));
    elif [ "$now" = "$after_ok" ]; then committed_new=$((committed_new + 1));
    else fail "trial $trial (rank $victim, $call #$n): the checkpoint holds neither the old nor the new state"; fi
    # The next save after a crash succeeds and commits.
    save "$steps" "$CKPT" >/dev/null 2>&1 || fail "trial $trial: the save after the crash failed"
    [ "$(digest "$CKPT")" = "$after_ok" ] || fail "trial $trial: the save after the crash did not commit its state"
  else
    survived=$((survived + 1))
    [ "$now" = "$after_ok" ] || fail "trial $trial: a save that succeeded did not commit its state"
  fi
  echo "trial $trial: rank $victim killed at $call #$n: exit $rc"
done
echo "$TRIALS trials: $killed killed ($kept_old kept the old checkpoint, $committed_new had committed the new one)," \
  "$survived finished before the chosen call; 0 inconsistent"
