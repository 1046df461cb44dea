#!/usr/bin/env bash
# torch.save files past 4 GiB (zip64 records) in both directions, with the
# real PyTorch; too large for CI, results in docs/STORAGE.md.
#
#   bash scripts/torch_zip64_check.sh [DIR]   (default /tmp/torch-zip64; needs ~14 GB of disk, ~10 GB of memory)
#
# 1. Python's torch.save writes a 4.4 GB int32 tensor (its record and the
#    records after it need zip64 fields).
# 2. `distckpt convert` reads it (zip64 as PyTorch's writer lays it out) and
#    writes it again as a torch.save file (zip64 as distckpt lays it out) and
#    as safetensors.
# 3. Python's torch.load opens distckpt's file; every element is compared.
set -euo pipefail
DIR=${1:-/tmp/torch-zip64}
BIN=${DISTCKPT_BIN:-$(cd "$(dirname "$0")/.." && pwd)/build/bin}
N=$(((1 << 30) + (1 << 27)))  # int32 elements: 4.5 GiB
rm -rf "$DIR"; mkdir -p "$DIR"
trap 'rm -rf "$DIR"' EXIT
/usr/bin/python3 -c "
import sys, torch
torch.save({'t': torch.arange($N, dtype=torch.int32), 'after': torch.tensor([7, 8])}, sys.argv[1])" "$DIR/python.pt"
ls -l "$DIR/python.pt"
/usr/bin/time -f "convert --to torch: %e s, peak RSS %M KiB" "$BIN/distckpt" convert "$DIR/python.pt" "$DIR/distckpt.pt" --to torch
/usr/bin/time -f "convert --to safetensors: %e s, peak RSS %M KiB" "$BIN/distckpt" convert "$DIR/python.pt" "$DIR/st" --to safetensors
/usr/bin/python3 - "$DIR/distckpt.pt" <<'PY'
import sys, zipfile, torch
z = zipfile.ZipFile(sys.argv[1])
print("records:", [(i.filename, i.file_size, i.header_offset) for i in z.infolist()])
d = torch.load(sys.argv[1])
t = d["t"]
ok = torch.equal(t, torch.arange(t.numel(), dtype=torch.int32)) and d["after"].tolist() == [7, 8]
print("torch.load of distckpt's file:", t.dtype, t.numel(), "elements, equal:", ok)
sys.exit(0 if ok else 1)
PY
