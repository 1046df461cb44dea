#!/usr/bin/env bash
# Starts bench/dcp_baseline.py as NRANKS local processes (a gloo group on
# 127.0.0.1) and prints rank 0's output. torchrun is not used because it
# crashes while starting workers with Debian's torch 1.13 on Python 3.11.
#
#   bash bench/dcp_baseline.sh -n NRANKS -- [dcp_baseline.py options]
#
# PYTHON picks the interpreter (default: Debian's /usr/bin/python3, which is
# where python3-torch is installed; a python3 earlier on PATH may lack torch).
# MASTER_PORT may be set; otherwise a free port is picked.
set -euo pipefail

usage() { echo "usage: $0 -n NRANKS -- [dcp_baseline.py options]" >&2; exit 2; }

nranks=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    -n) [[ $# -ge 2 ]] || usage; nranks="$2"; shift 2 ;;
    --) shift; break ;;
    *) usage ;;
  esac
done
[[ "$nranks" =~ ^[1-9][0-9]*$ ]] || usage

python="${PYTHON:-/usr/bin/python3}"
# The build's Python package (BUILD_DIR as for compare_dcp.sh, default build):
# its torch 1.13 import workaround, and the reader/writer --distckpt times.
package="${BUILD_DIR:-build}/python"
[[ -f "$package/distckpt/__init__.py" ]] || { echo "$0: no Python package in $package; build first (or set BUILD_DIR)" >&2; exit 2; }
export PYTHONPATH="$(cd "$package" && pwd)${PYTHONPATH:+:$PYTHONPATH}"
script="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/dcp_baseline.py"
port="${MASTER_PORT:-$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}"
logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT

# Rank 0 writes to the terminal as it goes; the others to logs, shown only
# if they fail.
declare -A rank_of
for ((r = 0; r < nranks; r++)); do
  export RANK=$r WORLD_SIZE=$nranks LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port
  if ((r == 0)); then
    "$python" "$script" "$@" &
  else
    "$python" "$script" "$@" >"$logs/rank$r.log" 2>&1 &
  fi
  rank_of[$!]=$r
done

# A rank that dies leaves the others waiting in a collective: stop them.
status=0
while ((${#rank_of[@]} > 0)); do
  pid=""
  rc=0
  wait -n -p pid "${!rank_of[@]}" || rc=$?
  [[ -n "$pid" ]] || break
  r=${rank_of[$pid]}
  unset "rank_of[$pid]"
  if ((rc != 0)); then
    echo "rank $r exited with status $rc" >&2
    [[ -f "$logs/rank$r.log" ]] && tail -n 30 "$logs/rank$r.log" >&2
    status=1
    for other in "${!rank_of[@]}"; do kill "$other" 2>/dev/null || true; done
  fi
done
exit $status
