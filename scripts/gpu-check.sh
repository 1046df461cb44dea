#!/usr/bin/env bash
# Builds distckpt against a CUDA LibTorch (the PyTorch wheel of python3) on a
# lent GPU machine and runs the GPU tests and the GPU bench there. That machine
# reaches no package registry and may not run Debian, so the Debian 12 packages
# the build needs besides LibTorch and CUDA travel along as .deb files:
#
#   bash scripts/gpu-check.sh fetch          # here: apt-get download into gpu-deps/debs
#   bash scripts/gpu-check.sh run [OUTDIR]   # there: unpack, configure, build, tests, bench
#
# gpu-deps/ is ignored: carry gpu-deps/debs. run writes one log per step to
# OUTDIR (default $OUT, else build-gpu/gpu-check), ends with one line per step
# (PASS/FAIL/SKIP) and exits non-zero when a step failed (on a machine whose
# nvidia-smi sees a GPU, a GPU test or bench that skipped counts as failed).
# Environment:
#   DISTCKPT_TORCH_PREFIX              CMake prefix of TorchConfig.cmake (default: python3's torch)
#   DISTCKPT_GPU_CHECK_NCCL=ON|OFF     DISTCKPT_WITH_NCCL (c10d's ProcessGroupNCCL)
#   DISTCKPT_GPU_CHECK_CONFIGURE_ONLY=1  stop after configuring
#   DISTCKPT_GPU_CHECK_TIMEOUT=120     seconds each test/bench run may take
#   DISTCKPT_GPU_CHECK_DEADLINE=3600   seconds from the start by which compiling the
#                                      whole suite against this LibTorch (last) stops
#   DISTCKPT_GPU_CHECK_FAIL_FAST=1     no whole-suite compile after a failed step
#   DISTCKPT_GPU_CHECK_BUILD_TYPE=Release  CMAKE_BUILD_TYPE (RelWithDebInfo for a debugger)
set -euo pipefail
cd "$(dirname "$0")/.."
DEPS=$PWD/gpu-deps DEBS=$PWD/gpu-deps/debs ROOT=$PWD/gpu-deps/root BUILD=$PWD/build-gpu
LIBDIR=$ROOT/usr/lib/x86_64-linux-gnu
# Headers, CMake configs and flatc; cmake and ninja for a host without them (their
# own runtime libraries are not fetched); libgloo-dev only for a wheel without gloo's headers.
DEV=(libflatbuffers-dev flatbuffers-compiler flatbuffers-compiler-dev nlohmann-json3-dev libfmt-dev
  libcli11-dev tao-pegtl-dev libxxhash-dev libgtest-dev libgloo-dev cmake cmake-data ninja-build)

fetch() {
  mkdir -p "$DEBS"
  # The shared libraries the build links, under their versioned names (libfmt9, ...): asked of apt.
  local rt pkgs missing=() p log
  mapfile -t rt < <(apt-cache depends --no-recommends --no-suggests "${DEV[@]}" |
    sed -n 's/^ *Depends: \(lib\(flatbuffers\|fmt\|xxhash\)[0-9][a-z0-9.+-]*\)$/\1/p' | sort -u)
  pkgs=("${DEV[@]}" "${rt[@]}")
  for p in "${pkgs[@]}"; do compgen -G "$DEBS/${p}_*.deb" >/dev/null || missing+=("$p"); done
  if [ ${#missing[@]} -gt 0 ]; then
    log=$(mktemp)
    if ! (cd "$DEBS" && apt-get download "${missing[@]}") >"$log" 2>&1; then
      tail -n 20 "$log" >&2; echo "fetch: apt-get download failed" >&2; exit 1
    fi
    rm -f "$log"
  fi
  local bytes; bytes=$(du -cb "$DEBS"/*.deb | tail -n 1 | cut -f1)
  echo "fetch: ${#pkgs[@]} packages, $((bytes / 1024)) KiB in gpu-deps/debs: ${pkgs[*]}"
  [ "$bytes" -lt $((60 << 20)) ] || { echo "fetch: more than 60 MiB" >&2; exit 1; }
}

# Unpacks every .deb into gpu-deps/root (never into /): dpkg-deb where there is
# one, else python3 (a .deb is an ar archive whose data.tar.* holds the files).
unpack() {
  rm -rf "$ROOT" && mkdir -p "$ROOT" || return 1
  if command -v dpkg-deb >/dev/null; then
    for deb in "$DEBS"/*.deb; do dpkg-deb -x "$deb" "$ROOT" || return 1; done
  else
    python3 - "$ROOT" "$DEBS"/*.deb <<'EOF' || return 1
import io, sys, tarfile
for deb in sys.argv[2:]:
    with open(deb, 'rb') as f:
        assert f.read(8) == b'!<arch>\n', deb
        while len(head := f.read(60)) == 60:
            size = int(head[48:58]); data = f.read(size); f.read(size % 2)
            if head[:16].startswith(b'data.tar'):
                with tarfile.open(fileobj=io.BytesIO(data)) as t:
                    t.extractall(sys.argv[1], **({'filter': 'tar'} if hasattr(tarfile, 'tar_filter') else {}))
EOF
  fi
  echo "unpack: $(ls "$DEBS"/*.deb | wc -l) debs into gpu-deps/root" >&3
}

# A line for the log (stdout) and for the console (fd 3).
both() { echo "$1"; echo "$1" >&3; }

configure() {
  [ "$(uname -m)" = x86_64 ] || { echo "the debs are amd64, this host is $(uname -m)"; return 1; }
  compgen -G "$DEBS/*.deb" >/dev/null || { echo "no debs in gpu-deps/debs: run 'fetch' and carry it"; return 1; }
  unpack || return 1
  # Debian 12's flatc (glibc >= 2.34, GLIBCXX_3.4.29, as libfmt9 and libflatbuffers2 need too)
  # generates the FlatBuffers headers at build time: fail here, not minutes into the build.
  "$ROOT/usr/bin/flatc" --version || { echo "flatc cannot run on this host (glibc $(getconf GNU_LIBC_VERSION))"; return 1; }
  local tp tinc='' d h cmake gen=("Unix Makefiles") info torch_cuda='' torch_nccl='' pip_nccl='' nccl_h
  local with_nccl=${DISTCKPT_GPU_CHECK_NCCL:-ON}
  if [ -z "${DISTCKPT_TORCH_PREFIX:-}" ]; then
    # Line 1: the CMake prefix; 2: what is shown; 3: CUDA and NCCL versions; 4: pip's NCCL folder, if any.
    info=$(python3 -c 'import torch, importlib.util
print(torch.utils.cmake_prefix_path)
print("torch", torch.__version__, "cuda", torch.version.cuda, "gpu", torch.cuda.is_available())
try: nccl = ".".join(map(str, torch.cuda.nccl.version()[:3]))
except Exception: nccl = ""
print(torch.version.cuda or "", nccl)
try: print(importlib.util.find_spec("nvidia.nccl").submodule_search_locations[0])
except Exception: print("")') || return 1
    mapfile -t info <<<"$info"
    tp=${info[0]}; echo "${info[1]}"; echo "${info[1]}" >&3
    read -r torch_cuda torch_nccl <<<"${info[2]:-}"; pip_nccl=${info[3]:-}
  else
    tp=$DISTCKPT_TORCH_PREFIX
  fi
  # nvcc of the CUDA LibTorch was built with: its CMake config enables CUDA
  # and refuses a toolkit of another version than the one it finds first.
  [ ! -x /usr/local/cuda/bin/nvcc ] || PATH=$PATH:/usr/local/cuda/bin
  # (Warnings, not failures: LibTorch's config says what it cannot do without.)
  if ! command -v nvcc >/dev/null; then
    both "warning: no nvcc on PATH or in /usr/local/cuda/bin; LibTorch's CMake config looks for the CUDA toolkit"
  else
    d=$(nvcc --version | grep -oE 'release [0-9]+\.[0-9]+' | cut -d' ' -f2)
    if [ -n "$torch_cuda" ] && [ "${d%%.*}" != "${torch_cuda%%.*}" ]; then
      both "warning: nvcc is CUDA $d, LibTorch was built with CUDA $torch_cuda"
    fi
  fi
  # c10d's ProcessGroupNCCL embeds ncclConfig_t: distckpt must compile with
  # the nccl.h of the NCCL LibTorch loads (pip's, when PyTorch came from pip).
  if [ -n "$pip_nccl" ] && [ -f "$pip_nccl/include/nccl.h" ]; then
    export NCCL_ROOT=$pip_nccl
  fi
  nccl_h=${NCCL_ROOT:-$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")/..}/include/nccl.h
  if [ "$with_nccl" = ON ] && [ -n "$torch_nccl" ] && [ -f "$nccl_h" ]; then
    d=$(sed -n 's/^#define NCCL_\(MAJOR\|MINOR\|PATCH\)[ \t]*\([0-9]*\).*/\2/p' "$nccl_h" | paste -sd.)
    if [ "$d" != "$torch_nccl" ]; then
      with_nccl=OFF
      both "DISTCKPT_WITH_NCCL=OFF: $nccl_h is NCCL $d, LibTorch loads NCCL $torch_nccl (set NCCL_ROOT to its folder)"
    fi
  fi
  # The header checked above is the one CMake uses (not one from its cache or another prefix).
  local nccl_args=()
  [ ! -f "$nccl_h" ] || nccl_args+=(-DDISTCKPT_NCCL_INCLUDE_DIR="$(cd "${nccl_h%/nccl.h}" && pwd)")
  [ -z "$pip_nccl" ] || [ ! -f "$pip_nccl/lib/libnccl.so.2" ] || nccl_args+=(-DDISTCKPT_NCCL_LIBRARY="$pip_nccl/lib/libnccl.so.2")
  both "CUDA: nvcc $(command -v nvcc || echo none), LibTorch's CUDA ${torch_cuda:-?}, NCCL ${torch_nccl:-?}, nccl.h $nccl_h"
  for d in "$tp/include" "$tp/../../include"; do [ -d "$d/torch" ] && { tinc=$(cd "$d" && pwd); break; }; done
  [ -n "$tinc" ] || { echo "no LibTorch headers beside $tp"; return 1; }
  # LibTorch's include dir comes first on every compile line. Its gloo headers must win
  # (they match its compiled gloo); but where it ships a library distckpt also takes from
  # Debian (fmt: linked as libfmt9; flatbuffers: matching flatc), Debian's must win: -I
  # gpu-deps/first (searched before every -isystem) holds exactly those.
  [ ! -d "$tinc/gloo" ] || rm -rf "$ROOT/usr/include/gloo"
  rm -rf "$DEPS/first" && mkdir -p "$DEPS/first"
  for h in "$ROOT"/usr/include/*; do
    if [ -e "$tinc/${h##*/}" ]; then ln -s "$h" "$DEPS/first/"; fi
  done
  echo "headers of gpu-deps before LibTorch's ($tinc): $(ls "$DEPS/first" | tr '\n' ' ')"
  # The host's cmake when it is new enough, else Debian's; Ninja when there is one.
  cmake=$(command -v cmake || true)
  d=$([ -z "$cmake" ] || "$cmake" --version | head -n 1 | grep -oE '[0-9]+\.[0-9]+' | head -n 1)
  [ "$(printf '3.22\n%s\n' "$d" | sort -V | head -n 1)" = 3.22 ] || cmake=$ROOT/usr/bin/cmake
  d=$(command -v ninja || true); [ -n "$d" ] || { "$ROOT/usr/bin/ninja" --version >/dev/null 2>&1 && d=$ROOT/usr/bin/ninja; }
  [ -z "$d" ] || gen=(Ninja -DCMAKE_MAKE_PROGRAM="$d")
  CMAKE=$cmake
  # Root first, so find_package takes the unpacked packages over any of the host (or /usr);
  # its multiarch cmake dir by name, for hosts whose CMake knows no lib/x86_64-linux-gnu.
  "$CMAKE" -S . -B "$BUILD" -G "${gen[@]}" -DCMAKE_BUILD_TYPE="${DISTCKPT_GPU_CHECK_BUILD_TYPE:-Release}" -DDISTCKPT_PCH=ON \
    -DCMAKE_PREFIX_PATH="$ROOT/usr;$LIBDIR/cmake;$tp" -DFLATC="$ROOT/usr/bin/flatc" \
    -DDISTCKPT_WITH_NCCL="$with_nccl" ${NCCL_ROOT:+-DNCCL_ROOT="$NCCL_ROOT"} ${nccl_args[@]+"${nccl_args[@]}"} \
    -DCMAKE_CXX_FLAGS="-I$DEPS/first -isystem $ROOT/usr/include" \
    -DCMAKE_EXE_LINKER_FLAGS="-L$LIBDIR" -DCMAKE_SHARED_LINKER_FLAGS="-L$LIBDIR" || return 1
  echo "configure: $CMAKE, ${gen[0]}, LibTorch $tp, DISTCKPT_WITH_NCCL $with_nccl" >&3
}

# build SECONDS TARGET...: the targets that exist in this configuration, every
# failing file in one log, within SECONDS (0: no limit).
build() {
  local limit=$1 targets=() keep=(-k) t known; shift
  known=$("$CMAKE" --build "$BUILD" --target help) || return 1
  for t in "$@"; do
    if grep -qw -- "$t" <<<"$known"; then targets+=("$t"); fi
  done
  [ ! -f "$BUILD/build.ninja" ] || keep=(-k 0)
  timeout -k 5 "$limit" "$CMAKE" --build "$BUILD" -j "$(nproc)" --target "${targets[@]}" -- "${keep[@]}"
}

NAMES=() STATES=() LOGS=()
record() { NAMES+=("$1"); STATES+=("$2"); LOGS+=("${3:--}"); echo "$1: $2 ${3:-}" >&3; }
# step NAME LOG [tee] CMD...: runs CMD into OUTDIR/LOG (shown too with tee), records PASS/FAIL.
step() {
  local name=$1 log=$2 show='' rc=0 t0=$SECONDS; shift 2
  [ "$1" != tee ] || { show=1; shift; }
  echo "== $name: $*" >"$OUTDIR/$log"
  if [ -n "$show" ]; then
    "$@" 2>&1 | tee -a "$OUTDIR/$log" >&3 || rc=${PIPESTATUS[0]}
  else
    "$@" >>"$OUTDIR/$log" 2>&1 || rc=$?
  fi
  local how="$((SECONDS - t0)) s"
  [ "$rc" = 0 ] || how+=", exit $rc$([ "$rc" != 124 ] || echo ': timed out')"
  echo "== $name: $how" >>"$OUTDIR/$log"
  if [ "$rc" = 0 ]; then record "$name" PASS "$log ($how)"; else record "$name" FAIL "$log ($how)"; fi
}
# ran NAME BINARY CMD...: a step where BINARY was built, else SKIP.
ran() {
  local name=$1 binary=$2; shift 2
  if [ -x "$binary" ]; then step "$name" "$name.log" tee "$@"; else record "$name" SKIP "(not built)"; fi
}
state() { local i; for i in "${!NAMES[@]}"; do [ "${NAMES[$i]}" != "$1" ] || echo "${STATES[$i]}"; done; }
# fail_if_skipped NAME PATTERN: on a machine with a GPU, a passed step whose log
# matches PATTERN (a test or the bench skipped: LibTorch saw no GPU) fails.
fail_if_skipped() {
  local i
  [ "$(state nvidia-smi)" = PASS ] || return 0
  for i in "${!NAMES[@]}"; do
    if [ "${NAMES[$i]}" = "$1" ] && [ "${STATES[$i]}" = PASS ] && grep -q -- "$2" "$OUTDIR/$1.log"; then
      STATES[$i]=FAIL LOGS[$i]+=" skipped although nvidia-smi sees a GPU"
      echo "$1: FAIL: skipped although nvidia-smi sees a GPU" >&3
    fi
  done
}

summary() {
  local i rc=0 f
  for f in "$OUTDIR"/*.log; do  # what comes back: each log under 16 MiB
    [ "$(stat -c %s "$f")" -lt $((15 << 20)) ] ||
      { { head -c 1M "$f"; echo; echo "[... cut ...]"; tail -c 13M "$f"; } >"$f.cut" && mv "$f.cut" "$f"; }
  done
  for i in "${!NAMES[@]}"; do
    printf '%-4s %-12s %s\n' "${STATES[$i]}" "${NAMES[$i]}" "${LOGS[$i]}"
  done | tee "$OUTDIR/summary.log" >&3
  if grep -q '^FAIL' "$OUTDIR/summary.log"; then rc=1; fi
  exit $rc
}

run() {
  OUTDIR=${1:-${OUT:-$BUILD/gpu-check}}
  mkdir -p "$OUTDIR" && OUTDIR=$(cd "$OUTDIR" && pwd)
  # Debian's shared libraries (libfmt9, libxxhash0, libflatbuffers2) for every program run.
  export LD_LIBRARY_PATH=$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  if command -v nvidia-smi >/dev/null; then
    step nvidia-smi nvidia-smi.log tee sh -c \
      'nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader'
    nvidia-smi >>"$OUTDIR/nvidia-smi.log" 2>&1 || true
  else
    record nvidia-smi SKIP
  fi
  step configure configure.log configure
  [ "$(state configure)" = PASS ] || tail -n 30 "$OUTDIR/configure.log" >&3
  # What was found, and the C++ runtime's link order (a warning about it too).
  grep -E '^-- distckpt: |133437' "$OUTDIR/configure.log" >&3 || true
  [ "${DISTCKPT_GPU_CHECK_CONFIGURE_ONLY:-0}" != 1 ] || summary
  # The GPU binaries first, run at once; then the whole suite compiles against
  # this LibTorch within what is left of DISTCKPT_GPU_CHECK_DEADLINE.
  if [ "$(state configure)" = PASS ]; then
    # A binary left by an earlier build must not run in place of one that failed to build.
    rm -f "$BUILD/tests/distckpt_gpu_tests" "$BUILD/tests/distckpt_nccl_tests" "$BUILD/bin/gpu_save_bench"
    step build build.log build 0 distckpt_gpu_tests distckpt_nccl_tests gpu_save_bench
    [ "$(state build)" = PASS ] || tail -n 60 "$OUTDIR/build.log" >&3
    # Which LibTorch, CUDA and NCCL libraries the GPU tests load (libtorch_cuda among them).
    # libstdc++ must come first (cmake/DistckptCxxRuntime.cmake).
    { echo "== libraries of distckpt_gpu_tests:"; readelf -d "$BUILD/tests/distckpt_gpu_tests" | grep -m 4 NEEDED
      ldd "$BUILD/tests/distckpt_gpu_tests" | grep -E 'stdc\+\+|torch|c10|nccl|cuda'; } >>"$OUTDIR/build.log" 2>&1 || true
  else
    record build SKIP
  fi
  # Each binary that was built runs, even where another one failed to build.
  local t=${DISTCKPT_GPU_CHECK_TIMEOUT:-120}
  ran gpu-tests "$BUILD/tests/distckpt_gpu_tests" env OMP_NUM_THREADS=1 timeout -k 10 "$t" "$BUILD/tests/distckpt_gpu_tests"
  ran nccl-tests "$BUILD/tests/distckpt_nccl_tests" timeout -k 10 "$t" "$BUILD/tests/distckpt_nccl_tests"
  ran gpu-bench "$BUILD/bin/gpu_save_bench" timeout -k 10 "$t" "$BUILD/bin/gpu_save_bench"
  fail_if_skipped gpu-tests '^\[  SKIPPED \]'
  fail_if_skipped nccl-tests '^\[  SKIPPED \]'
  fail_if_skipped gpu-bench 'nothing measured'
  local left=$((${DISTCKPT_GPU_CHECK_DEADLINE:-3600} - SECONDS))
  if [ "$(state configure)" != PASS ]; then
    record build-all SKIP
  elif [ "${DISTCKPT_GPU_CHECK_FAIL_FAST:-0}" = 1 ] && printf "%s\n" "${STATES[@]}" | grep -x FAIL >/dev/null; then
    record build-all SKIP "(a step failed and DISTCKPT_GPU_CHECK_FAIL_FAST=1)"
  elif [ "$left" -lt 30 ]; then
    record build-all SKIP "(${left} s left of DISTCKPT_GPU_CHECK_DEADLINE)"
  else
    step build-all build-all.log build "$left" distckpt_tests
    [ "$(state build-all)" = PASS ] || tail -n 40 "$OUTDIR/build-all.log" >&3
  fi
  summary
}

exec 3>&1
case "${1:-}" in
  fetch) fetch ;;
  run) shift; run "$@" ;;
  *) echo "usage: $0 fetch | run [OUTDIR]" >&2; exit 2 ;;
esac
