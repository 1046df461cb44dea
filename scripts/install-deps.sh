#!/usr/bin/env bash
# Installs every build/test dependency of distckpt from Debian 12 packages.
# Idempotent: when everything is already installed it only runs dpkg queries.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build ccache
  libtorch-dev libgloo-dev            # LibTorch (CPU) with c10d + Gloo
  libflatbuffers-dev flatbuffers-compiler
  nlohmann-json3-dev libgtest-dev
  libxxhash-dev                       # per-block chunk checksums (XXH3)
  libcli11-dev libfmt-dev             # command lines, message formatting
  clang-format                        # style check (scripts/check-format.sh)
  clang-16 libclang-rt-16-dev         # libFuzzer + sanitizers (scripts/fuzz.sh)
  strace                              # faults and crashes injected at exact system calls (tests, torture scripts)
  tao-pegtl-dev                       # schema DSL grammar
  python3-torch                       # interop tests (safetensors, torch.save) and the PyTorch DCP baseline
  python3-flatbuffers python3-xxhash  # the Python package (python/): FlatBuffers bindings, block checksums
  iproute2 util-linux                 # multi-host tests: hosts as network namespaces (ip, unshare)
  libcurl4-openssl-dev libssl-dev     # the S3 client: HTTP(S) over libcurl, SigV4 signing with libcrypto
  libzstd-dev zstd                    # PyTorch DCP items compressed with zstd (the CLI makes test fixtures)
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
# apt and dpkg print a line per package: keep them in a log, show it on failure.
log=$(mktemp -t distckpt-install-deps.XXXXXX.log)
if ! { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq \
      --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
  tail -n 40 "$log" >&2
  echo "install-deps: apt-get failed (whole log: $log)" >&2
  exit 1
fi
echo "install-deps: installed ${#missing[@]} packages (log: $log)"
