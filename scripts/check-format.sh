#!/usr/bin/env bash
# Fails when a tracked C++ file differs from what clang-format makes of it
# (.clang-format at the root). generated/ is distckpt-gen's output, pinned by
# its golden test instead. `--fix` rewrites the files in place.
set -euo pipefail
cd "$(dirname "$0")/.."
CLANG_FORMAT=${CLANG_FORMAT:-clang-format}
# Untracked files too (not ignored ones): new files are checked before their first commit.
mapfile -t files < <(git ls-files --cached --others --exclude-standard '*.h' '*.cpp' | grep -v '^generated/')
if [ "${1:-}" = "--fix" ]; then
  "$CLANG_FORMAT" -i "${files[@]}"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  "$CLANG_FORMAT" --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if [ ${#bad[@]} -gt 0 ]; then
  printf 'check-format: %s is not clang-formatted\n' "${bad[@]}" >&2
  echo "check-format: run 'bash scripts/check-format.sh --fix' ($("$CLANG_FORMAT" --version))" >&2
  exit 1
fi
echo "check-format: ${#files[@]} files clean"
