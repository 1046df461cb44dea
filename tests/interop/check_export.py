"""Checks files written by distckpt with the real PyTorch: safetensors,
read by the published format alone, or a .pt read by torch.load. Every
tensor of write_safetensors.TENSORS must be there with its values (and
dtype, or DTYPE for floating-point tensors when given), and nothing else:
a .pt made from safetensors holds the tensors alone ("format" = "pt" of
"__metadata__" describes the files, not the state), so a module's
load_state_dict takes it.

    python3 check_export.py DIR|FILE.pt [DTYPE]

DIR holds model.safetensors, or model.safetensors.index.json and shards.
Prints "ok N tensors in F files" or fails with the first difference.
"""
import json
import os
import struct
import sys

import torch

from write_safetensors import DTYPES, TENSORS, value

BY_NAME = {v: k for k, v in DTYPES.items()}


def read_file(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    assert header.pop("__metadata__", {}) == {"format": "pt"}, f"{path}: __metadata__"
    out, ends = {}, []
    for name, info in header.items():
        begin, end = info["data_offsets"]
        raw = bytearray(data[8 + n + begin:8 + n + end])
        dtype = BY_NAME[info["dtype"]]
        # clone: the tensor must not outlive `raw`, whose memory frombuffer shares
        flat = torch.frombuffer(raw, dtype=torch.uint8).clone() if raw else torch.empty(0, dtype=torch.uint8)
        if dtype == torch.bool:
            t = flat.to(torch.bool)
        else:
            t = flat.view(dtype) if raw else torch.empty(0, dtype=dtype)
        out[name] = t.reshape(info["shape"])
        ends.append((begin, end))
    ends.sort()
    assert [b for b, _ in ends] == [0] + [e for _, e in ends[:-1]], f"{path}: offsets do not tile the data"
    assert not ends or 8 + n + ends[-1][1] == len(data), f"{path}: trailing bytes"
    return out


def read_all(root):
    """(tensors by name, files read)"""
    if root.endswith(".pt"):
        loaded = torch.load(root)
        assert isinstance(loaded, dict), f"{root}: a {type(loaded)}, not a dict"
        assert "format" not in loaded, f"{root}: the files' \"format\" became a value of the state"
        return loaded, [root]
    index = os.path.join(root, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        files = sorted(set(weight_map.values()))
    else:
        weight_map, files = None, ["model.safetensors"]
    tensors = {}
    for file in files:
        got = read_file(os.path.join(root, file))
        if weight_map is not None:
            assert all(weight_map[name] == file for name in got), f"{file}: tensors the index puts elsewhere"
        tensors.update(got)
    return tensors, files


def main():
    root = sys.argv[1]
    wanted = getattr(torch, sys.argv[2]) if len(sys.argv) > 2 else None
    tensors, files = read_all(root)
    assert set(tensors) == {name for name, _, _ in TENSORS}, f"names differ: {sorted(tensors)}"
    for k, (name, shape, dtype) in enumerate(TENSORS):
        expected = value(k, shape, dtype)
        if wanted is not None and dtype.is_floating_point:
            expected = expected.to(wanted)
        got = tensors[name]
        assert got.dtype == expected.dtype, f"{name}: dtype {got.dtype}, expected {expected.dtype}"
        assert tuple(got.shape) == tuple(expected.shape), f"{name}: shape {tuple(got.shape)}"
        assert torch.equal(got, expected), f"{name}: values differ"
    print(f"ok {len(tensors)} tensors in {len(files)} files")


if __name__ == "__main__":
    main()
