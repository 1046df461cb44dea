#!/usr/bin/env bash
# Compiles every source file that uses LibTorch (syntax only) against the
# headers of a LibTorch 2.x: Debian's libtorch-dev of another release, fetched
# as a .deb and unpacked into build/torch2 (never installed). This machine has
# only LibTorch 1.13; the 2.x differences (c10d's Backend, headers that no
# longer include each other) show up here without a GPU machine.
#
#   bash scripts/torch2-check.sh [trixie|sid]   # trixie: LibTorch 2.6 (C++17); sid: newer (C++20)
#
# Needs a configured ./build (scripts/build.sh) and deb.debian.org. Prints the
# errors and one summary line; exits non-zero when a file does not compile.
set -euo pipefail
cd "$(dirname "$0")/.."
SUITE=${1:-trixie}
WORK=$PWD/build/torch2/$SUITE
[ -f build/build.ninja ] || { echo "no build/build.ninja: run scripts/build.sh first" >&2; exit 2; }
mkdir -p "$WORK/lists/partial" "$WORK/cache/archives/partial"
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $SUITE main" \
  >"$WORK/sources.list"
# A private apt state: the system's sources, lists and cache stay as they are.
APT=(-o Dir::Etc::SourceList="$WORK/sources.list" -o Dir::Etc::SourceParts=/dev/null
  -o Dir::State::Lists="$WORK/lists" -o Dir::Cache="$WORK/cache" -o APT::Architecture=amd64
  -o APT::Sandbox::User=root)
if ! compgen -G "$WORK/libtorch-dev_*.deb" >/dev/null; then
  apt-get "${APT[@]}" -qq update >/dev/null
  (cd "$WORK" && apt-get "${APT[@]}" -qq download libtorch-dev >/dev/null)
fi
rm -rf "$WORK/root" && dpkg-deb -x "$WORK"/libtorch-dev_*.deb "$WORK/root"
INC=$WORK/root/usr/include
# The version defines moved to torch/headeronly/version.h in newer releases.
VERSION=$(for h in "$INC"/torch/csrc/api/include/torch/version.h "$INC"/torch/headeronly/version.h; do
  [ ! -f "$h" ] || sed -n 's/^#define TORCH_VERSION_\(MAJOR\|MINOR\|PATCH\) *\([0-9]*\).*/\2/p' "$h"
done | paste -sd.)
STD=-std=c++17
[ "$(printf '2.12\n%s\n' "$VERSION" | sort -V | head -n 1)" != 2.12 ] || STD=-std=c++20

# Every compile of the build that sees LibTorch's headers, turned into a
# syntax-only compile with the other headers first (no precompiled header:
# each file must include what it uses).
ninja -C build -t commands all | grep -- ' -c ' | grep 'torch/csrc/api/include' | sort -u |
  sed -e 's#^[^ ]*ccache ##' \
    -e "s#-isystem /usr/include/torch/csrc/api/include#-isystem $INC/torch/csrc/api/include -isystem $INC#" \
    -e 's#-include [^ ]*cmake_pch.hxx##' -e 's# -o [^ ]*# -fsyntax-only#' -e 's#-MD -MT [^ ]* -MF [^ ]*##' \
    -e "s#-std=c++[0-9]*#$STD#" -e 's# -g # #' | grep -v 'cmake_pch.hxx.cxx' >"$WORK/commands"
total=$(wc -l <"$WORK/commands")
rm -f "$WORK/errors" "$WORK/errors.count" && touch "$WORK/errors"
# One log per file; a file whose compile fails appends its log to errors.
tr '\n' '\0' <"$WORK/commands" | (cd build && xargs -0 -P "$(nproc)" -I{} sh -c \
  'log=$(mktemp); if ! {} >"$log" 2>&1; then cat "$log" >>"$0"; echo x >>"$0.count"; fi; rm -f "$log"' \
  "$WORK/errors")
failed=0
[ ! -f "$WORK/errors.count" ] || failed=$(wc -l <"$WORK/errors.count")
rm -f "$WORK/errors.count"
grep -E 'error' "$WORK/errors" | head -n 40 || true
echo "torch2-check: $total files against LibTorch $VERSION ($SUITE, $STD): $failed failed"
[ "$failed" = 0 ]
