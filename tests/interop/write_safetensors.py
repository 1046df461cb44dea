"""Writes safetensors files from real PyTorch tensors, by the published
format alone (no safetensors package): an 8-byte little-endian header
length, a JSON header, then each tensor's row-major bytes.

    python3 write_safetensors.py OUT

OUT/single/model.safetensors   every dtype the format shares with LibTorch
OUT/sharded/                   two shards and model.safetensors.index.json

Tensor k of shape S holds arange(numel(S)) * 0.25 - k in float64, converted
to its dtype, so the C++ test recomputes every value exactly.
"""
import json
import os
import struct
import sys

import torch

DTYPES = {
    torch.float32: "F32", torch.float64: "F64", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL",
}

# (name, shape, dtype); the same list is in tests/e2e/interop_test.cpp.
TENSORS = [
    ("model.embed_tokens.weight", (40, 16), torch.float32),
    ("model.layers.0.self_attn.q_proj.weight", (16, 16), torch.bfloat16),
    ("model.layers.0.mlp.up_proj.weight", (24, 16), torch.float16),
    ("model.norm.weight", (16,), torch.float64),
    ("positions", (3, 5), torch.int64),
    ("counts", (7,), torch.int32),
    ("small", (2, 2), torch.int16),
    ("signed", (9,), torch.int8),
    ("bytes", (11,), torch.uint8),
    ("mask", (4, 3), torch.bool),
    ("step", (), torch.int64),
    ("empty", (0, 4), torch.float32),
]


def value(k, shape, dtype):
    n = 1
    for s in shape:
        n *= s
    return (torch.arange(n, dtype=torch.float64) * 0.25 - k).reshape(shape).to(dtype)


def raw_bytes(t):
    flat = t.contiguous().reshape(-1)
    if flat.numel() == 0:
        return b""
    return flat.view(torch.uint8).numpy().tobytes() if t.dtype != torch.bool else flat.to(torch.uint8).numpy().tobytes()


def write(path, named):
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in named:
        data = raw_bytes(t)
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def main():
    out = sys.argv[1]
    named = [(name, value(k, shape, dtype)) for k, (name, shape, dtype) in enumerate(TENSORS)]
    os.makedirs(f"{out}/single")
    write(f"{out}/single/model.safetensors", named)
    os.makedirs(f"{out}/sharded")
    halves = [named[: len(named) // 2], named[len(named) // 2:]]
    weight_map = {}
    for i, half in enumerate(halves):
        file = f"model-{i + 1:05d}-of-00002.safetensors"
        write(f"{out}/sharded/{file}", half)
        weight_map.update({name: file for name, _ in half})
    with open(f"{out}/sharded/model.safetensors.index.json", "w") as f:
        json.dump({"metadata": {"total_size": sum(len(raw_bytes(t)) for _, t in named)}, "weight_map": weight_map}, f)


if __name__ == "__main__":
    main()
