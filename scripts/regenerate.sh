#!/usr/bin/env bash
# Regenerates generated/ from schema/models/*.shard with the freshly built
# distckpt-gen. The golden test fails until this output is committed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh distckpt_gen
for schema in schema/models/*.shard; do
  "${BUILD_DIR:-build}/bin/distckpt-gen" "$schema" --out-dir generated
done
echo "regenerated: $(ls generated | tr '\n' ' ')"
