#!/usr/bin/env bash
# Simulated hosts for the multi-host tests. Host I is the network namespace
# NAME-hI with one veth (eth0, 10.213.0.<I+1>/24) to a bridge in NAME-br;
# what `exec` starts there also gets its own host name (hostI, in a UTS
# namespace). Nothing is added to the machine's own namespaces, so runs with
# distinct NAMEs do not collide and no traffic leaves the namespaces.
#   netns_hosts.sh check                   exit 0 when namespaces can be made here, else 77 and why
#   netns_hosts.sh up NAME HOSTS           create the bridge and HOSTS hosts
#   netns_hosts.sh down NAME               kill what runs on them, delete them (idempotent)
#   netns_hosts.sh gc PREFIX               down every PREFIX<pid>-* whose test process <pid> is gone
#   netns_hosts.sh addr I                  host I's address
#   netns_hosts.sh exec NAME I CMD...      run CMD on host I
#   netns_hosts.sh job NAME HOSTS N -- PROGRAM ARGS...
#       distckpt-launch ($DISTCKPT_LAUNCH) on every host, N ranks each, rendezvous at host 0;
#       "%h" in ARGS becomes the host index; output lines tagged "[host I]"; ends with one
#       line "host I exit CODE" per host; each launcher is killed after $JOB_TIMEOUT (60) s
#   netns_hosts.sh link NAME I up|down     bring host I's link up or down
#   netns_hosts.sh kill NAME I             SIGKILL every process on host I
#   netns_hosts.sh bytes NAME I            bytes received + sent on host I's link
set -euo pipefail

readonly PORT=29500

addr() { echo "10.213.0.$(($1 + 1))"; }

check() {
  if [ "$(id -u)" != 0 ]; then
    echo "needs root to create network namespaces (running as uid $(id -u))"
    exit 77
  fi
  for tool in ip unshare timeout; do
    if ! command -v "$tool" >/dev/null; then
      echo "needs '$tool' (Debian packages iproute2, util-linux, coreutils)"
      exit 77
    fi
  done
  # Containers often deny namespaces or bridges even to root: try once.
  local probe="dcmhcheck$$"
  if ! err=$({ ip netns add "$probe" && ip -n "$probe" link add br0 type bridge &&
    ip -n "$probe" link add eth0 type veth peer name p0; } 2>&1); then
    ip netns del "$probe" 2>/dev/null || true
    echo "cannot create network namespaces, bridges or veths here: $err"
    exit 77
  fi
  ip netns del "$probe"
}

namespaces_of() { ip netns list | awk '{print $1}' | grep -E "^$1-(br|h[0-9]+)\$" || true; }

down() {
  local ns
  for ns in $(namespaces_of "$1"); do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
  done
}

gc() {
  local ns pid
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^$1[0-9]+-" || true); do
    pid=${ns#"$1"}
    pid=${pid%%-*}
    if ! kill -0 "$pid" 2>/dev/null; then down "${ns%-*}"; fi
  done
}

up() {
  local name=$1 hosts=$2 i
  trap 'down "$name"' ERR  # a half-built set is removed
  ip netns add "$name-br"
  ip -n "$name-br" link add br0 type bridge
  ip -n "$name-br" link set br0 up
  for ((i = 0; i < hosts; i++)); do
    ip netns add "$name-h$i"
    ip -n "$name-h$i" link set lo up
    ip -n "$name-h$i" link add eth0 type veth peer name "p$i" netns "$name-br"
    ip -n "$name-h$i" addr add "$(addr "$i")/24" dev eth0
    ip -n "$name-h$i" link set eth0 up
    ip -n "$name-br" link set "p$i" master br0 up
  done
  trap - ERR
}

exec_on() {
  local name=$1 i=$2
  shift 2
  exec ip netns exec "$name-h$i" unshare --uts sh -c 'hostname "$0" && exec "$@"' "host$i" "$@"
}

job() {
  local name=$1 hosts=$2 nprocs=$3 i status=0 code
  shift 3
  [ "${1:-}" = "--" ] && shift
  local codes
  codes=$(mktemp -d)
  for ((i = 0; i < hosts; i++)); do
    {
      (exec_on "$name" "$i" timeout -s KILL "${JOB_TIMEOUT:-60}" "$DISTCKPT_LAUNCH" --nnodes "$hosts" \
        --node-rank "$i" -n "$nprocs" --master-addr "$(addr 0)" --master-port "$PORT" --tag-output \
        -- "${@//%h/$i}") 2>&1 && echo 0 >"$codes/$i" || echo $? >"$codes/$i"
    } | sed -u "s/^/[host $i] /" &
  done
  wait
  for ((i = 0; i < hosts; i++)); do
    code=$(cat "$codes/$i")
    echo "host $i exit $code"
    [ "$code" = 0 ] || status=1
  done
  rm -rf "$codes"
  return "$status"
}

bytes() {
  local stats=/sys/class/net/eth0/statistics
  ip netns exec "$1-h$2" sh -c "echo \$((\$(cat $stats/rx_bytes) + \$(cat $stats/tx_bytes)))"
}

command=${1:-}
shift || true
case "$command" in
  check) check ;;
  up) up "$@" ;;
  down) down "$@" ;;
  gc) gc "$@" ;;
  addr) addr "$@" ;;
  exec) exec_on "$@" ;;
  job) job "$@" ;;
  link) ip -n "$1-h$2" link set eth0 "$3" ;;
  kill) ip netns pids "$1-h$2" | xargs -r kill -9 ;;
  bytes) bytes "$@" ;;
  *)
    sed -n '2,/^set -euo/p' "$0" | sed '$d' >&2
    exit 2
    ;;
esac
