#!/usr/bin/env bash
# Crash consistency of local checkpoints: kill -9 a random rank of a 2-rank
# job (each rank replicating to the other) at its Nth call of a random
# file-changing syscall, via strace fault injection, while it saves. About
# a third of the saves come from a new run that resumed from an older state
# and saves an iteration the previous run already saved. After every trial
# no rank survives and the latest local checkpoint loads bitwise on both
# ranks, one run's state: after a finished save the one it saved; after a
# killed save the one before or the one it saved. A killed save of a resumed
# run may also leave none (the job falls back to its global checkpoint) or
# an older one whose files an earlier crash left (a state that was the
# latest once). The next save after the last trial succeeds.
#   scripts/local_crash_torture.sh [TRIALS=100] [SEED=1]   (uses ./build; BUILD_DIR to change)
set -euo pipefail
cd "$(dirname "$0")/.."
TRIALS=${1:-100}
SEED=${2:-1}
BIN=$(realpath "${BUILD_DIR:-build}")/bin
command -v strace >/dev/null || { echo "local_crash_torture: strace is needed (scripts/install-deps.sh)" >&2; exit 2; }
for tool in distckpt-launch distckpt_local_probe; do
  [ -x "$BIN/$tool" ] || { echo "missing $BIN/$tool: build first (scripts/build.sh)" >&2; exit 2; }
done
WORK=$(mktemp -d "${TMPDIR:-/tmp}/distckpt-local-torture-XXXXXX")
trap 'rm -rf "$WORK"' EXIT
export OMP_NUM_THREADS=1
# LeakSanitizer cannot run under ptrace (scripts/sanitize.sh builds): off for these jobs.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
RANDOM=$SEED
ROOT=$WORK/root
export SYSCALLS=pwrite64,pwritev,write,fsync,fdatasync,rename,renameat,renameat2,mkdir,unlink,unlinkat,rmdir

fail() {
  echo "local_crash_torture: FAILED: $*" >&2
  exit 1
}
# job ARGS... [-- VICTIM]: a 2-rank job of the probe; the victim rank (if
# any) is killed at its Nth call of CALL (environment).
# The victim's trace goes to $WORK/victim.strace: it shows whether the kill
# happened ("+++ killed by SIGKILL +++").
job() {
  local victim=${VICTIM:--1}
  rm -f "$WORK/victim.strace"
  TRACE=$WORK/victim.strace timeout -s KILL 180 "$BIN/distckpt-launch" -n 2 -- /bin/sh -c '
    if [ "$RANK" = "$1" ]; then
      shift; exec strace -f -q -o "$TRACE" -e trace="$SYSCALLS" -e inject="$CALL":signal=SIGKILL:when="$N" "$@"
    fi
    shift; exec "$@"' sh "$victim" "$BIN/distckpt_local_probe" "$ROOT" "$@" --ranks-per-node 1 --factor 2
}
# Prints "ITERATION RUN" of the latest complete local checkpoint, loaded
# bitwise and alike on both ranks, or "none" when the job must fall back.
latest() {
  local out rc=0 lines
  out=$(job load latest 2>&1) || rc=$?
  if [ "$rc" -ne 0 ]; then
    grep -q "load the global checkpoint instead" <<<"$out" || fail "the load failed: $out"
    echo none
    return
  fi
  lines=$(sed -n 's/^rank [01] loaded iteration \([0-9]*\) bitwise-equal recovered=\[[0-9,]*\] run=\([0-9]*\)$/\1 \2/p' <<<"$out" | sort -u)
  [ "$(grep -c "bitwise-equal" <<<"$out")" = 2 ] || fail "a rank did not load bitwise: $out"
  [ "$(wc -l <<<"$lines")" = 1 ] || fail "the ranks loaded different iterations or runs: $out"
  echo "$lines"
}

# How many of each call a thread of a rank makes while saving, at most (the
# range for N: strace counts calls per thread): rank 0 counted on the save
# of iteration 2 over 1, rank 1 on that of 3 over 2.
job save 1 >/dev/null
declare -A COUNTS
for rank in 0 1; do
  OUT="$WORK/calls$rank" timeout -s KILL 180 "$BIN/distckpt-launch" -n 2 -- /bin/sh -c '
    if [ "$RANK" = "$1" ]; then shift; exec strace -f -q -o "$OUT" -e trace="$SYSCALLS" "$@"; fi
    shift; exec "$@"' sh "$rank" "$BIN/distckpt_local_probe" "$ROOT" save $((rank + 2)) --ranks-per-node 1 --factor 2 >/dev/null
  while read -r calls name; do COUNTS[$rank:$name]=$calls; done < <(
    awk 'match($0, /^[0-9]+ +[a-z0-9_]+\(/) {
        split(substr($0, 1, RLENGTH - 1), f, / +/); k = f[2] " " f[1]
        if (++n[k] > m[f[2]]) m[f[2]] = n[k] }
      END { for (c in m) print m[c], c }' "$WORK/calls$rank")
done
for key in $(printf '%s\n' "${!COUNTS[@]}" | sort); do printf 'rank %s: %s calls of %s\n' "${key%%:*}" "${COUNTS[$key]}" "${key#*:}"; done

it=3 run=0 runs=0
state="3 0"     # the latest complete checkpoint: "ITERATION RUN", or none
history="[3 0]"  # every state that was ever the latest
killed=0 kept=0 saved=0 fell_back=0 older=0 finished=0 resumed=0
for ((trial = 1; trial <= TRIALS; trial++)); do
  from_older=0
  # The job restarted from the latest local checkpoint, if any.
  [ "$state" = none ] || read -r it run <<<"$state"
  if [ "$state" = none ] || [ $((RANDOM % 3)) = 0 ]; then
    # Or it resumed from an older state (a global checkpoint): a new run,
    # which saves the iteration the previous run holds.
    runs=$((runs + 1)) run=$runs resumed=$((resumed + 1)) from_older=1
  else
    it=$((it + 1))
  fi
  target="$it $run"
  victim=$((RANDOM % 2))
  mapfile -t calls < <(for key in "${!COUNTS[@]}"; do [ "${key%%:*}" = "$victim" ] && echo "${key#*:}"; done | sort)
  call=${calls[RANDOM % ${#calls[@]}]}
  n=$((RANDOM % COUNTS[$victim:$call] + 1))
  rc=0
  VICTIM=$victim CALL=$call N=$n job save "$it" --run "$run" >"$WORK/trial.log" 2>&1 || rc=$?
  if pgrep -f -- "distckpt_local_probe $ROOT" >/dev/null; then fail "trial $trial: a rank outlived the job"; fi
  what="trial $trial (save of iteration $it run $run; rank $victim killed at $call #$n)"
  # A save that failed must have failed because its victim was killed.
  if [ "$rc" -ne 0 ] && ! grep -q "killed by SIGKILL" "$WORK/victim.strace" 2>/dev/null; then
    fail "$what: the save failed without the kill: $(tail -n 5 "$WORK/trial.log")"
  fi
  now=$(latest)
  if [ "$rc" -eq 0 ]; then
    finished=$((finished + 1))
    [ "$now" = "$target" ] || fail "$what: the save finished, but the latest checkpoint is '$now'"
  else
    killed=$((killed + 1))
    if [ "$now" = "$target" ]; then saved=$((saved + 1))
    elif [ "$now" = "$state" ] && [ "$state" != none ]; then kept=$((kept + 1))
    elif [ "$from_older" = 1 ] && [ "$now" = none ]; then
      # The save had removed the previous run's files of its iteration (or
      # there were none), and its own were not complete.
      fell_back=$((fell_back + 1))
    elif [ "$from_older" = 1 ] && [[ "$history" == *"[$now]"* ]]; then
      # The crash cut short the removal of the previous run's files: an
      # older checkpoint, whose cleanup an earlier crash had cut short, is
      # the latest again (still one run's state, bitwise).
      older=$((older + 1))
    else fail "$what: the latest checkpoint is '$now', before the save it was '$state'"; fi
  fi
  state=$now
  [ "$now" = none ] || [[ "$history" == *"[$now]"* ]] || history+=" [$now]"
  echo "$what: exit $rc, latest: $now"
done
# The next save after the last crash succeeds.
VICTIM=-1 job save $((it + 1)) --run "$run" >/dev/null 2>&1 || fail "the save after the last trial failed"
[ "$(latest)" = "$((it + 1)) $run" ] || fail "the save after the last trial is not the latest"
echo "$TRIALS trials ($resumed by a resumed run): $killed killed ($kept kept the previous checkpoint," \
  "$saved had saved the new one, $fell_back fell back to the global checkpoint, $older left an older one the" \
  "latest), $finished finished before the chosen call; 0 inconsistent"
