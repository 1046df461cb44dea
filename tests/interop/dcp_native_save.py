"""Saves a state dict with PyTorch's OWN FileSystemWriter (1.13:
save_state_dict, 2.x: save) into OUT_DIR, from 1 or 2 ranks under gloo.

    distckpt-launch -n N -- python3 dcp_native_save.py OUT_DIR REFERENCE_PT [--single-file-per-rank]
    (N = 1 or 2; plain `python3 dcp_native_save.py ...` runs as one rank)

The state (values: element i, row-major, of KEY is i * 0.25 + len(KEY) in
float64 cast to the dtype; int64: i + len(KEY)):
    plain.weight  float32  [5, 3]  plain tensor (written once, by rank 0)
    plain.bias    bfloat16 [7]     plain tensor
    rows          float32  [10, 4] ChunkShardingSpec dim 0 (2 ranks: rows 0-5 | 5-10)
    cols          bfloat16 [6, 9]  ChunkShardingSpec dim 1 (2 ranks: cols 0-5 | 5-9)
    uneven        float32  [7, 5]  EnumerableShardingSpec: 2 ranks: rows [0,2) on
                                   rank 0, [2,7) on rank 1; 1 rank: rows [0,3) and
                                   [3,7), both on rank 0 (two chunks of one rank)
    ints          int64    [4, 4]  ChunkShardingSpec dim 0 (2 ranks: 2 + 2 rows)
    step = 7, lr = 0.5, name = "tiny", blob = b"\\x00\\x01abc",
    config = {"hidden": 8, "betas": [0.9, 0.95], "flag": True, "none": None}
    nested = {"inner": {"t": float64 [3]}}  the tensor is named "nested.inner.t"
On torch 1.13 every non-tensor value, "nested" included (the tensor inside
it too), is one bytes item holding torch.save(value); torch 2.x flattens
nested dicts ("nested.inner.t" is a tensor, "config.hidden" ... bytes items).
1.13's writer makes one file per item, __{rank}_{n}.distcp (n counts the
rank's items in state-dict order, offset 0 each); --single-file-per-rank
(2.x's default) one __{rank}_0.distcp per rank, bytes items first.
Rank 0 writes REFERENCE_PT = torch.save({dotted key: whole tensor}) for the
seven tensors. Prints "rank R: saved".
"""
import sys

import torch

import dcp_common as dc

TENSORS = {"plain.weight": ((5, 3), torch.float32), "plain.bias": ((7,), torch.bfloat16),
           "rows": ((10, 4), torch.float32), "cols": ((6, 9), torch.bfloat16),
           "uneven": ((7, 5), torch.float32), "ints": ((4, 4), torch.int64),
           "nested.inner.t": ((3,), torch.float64)}
OBJECTS = {"step": 7, "lr": 0.5, "name": "tiny", "blob": b"\x00\x01abc",
           "config": {"hidden": 8, "betas": [0.9, 0.95], "flag": True, "none": None}}


def state(rank, world):
    full = {key: dc.value(key, shape, dtype) for key, (shape, dtype) in TENSORS.items()}
    sd = {"plain.weight": full["plain.weight"], "plain.bias": full["plain.bias"]}
    for key, dim in (("rows", 0), ("cols", 1), ("ints", 0)):
        boxes, spec = dc.chunk_boxes(full[key].shape, dim, world)
        sd[key] = dc.sharded(full[key], boxes, rank, spec)
    cuts = [0, 2, 7] if world == 2 else [0, 3, 7]
    owners = [0, 1] if world == 2 else [0, 0]
    boxes = [((lo, 0), (hi - lo, 5), r) for lo, hi, r in zip(cuts, cuts[1:], owners)]
    sd["uneven"] = dc.sharded(full["uneven"], boxes, rank)
    sd.update(OBJECTS)
    sd["nested"] = {"inner": {"t": full["nested.inner.t"]}}
    return sd, full


def main(out_dir, reference, *flags):
    rank, world = dc.init_gloo()
    if world not in (1, 2):
        dc.fail("run with 1 or 2 ranks")
    sd, full = state(rank, world)
    writer = dc.dcp.FileSystemWriter(out_dir, single_file_per_rank="--single-file-per-rank" in flags)
    dc.save(sd, writer)
    if rank == 0:
        torch.save(full, reference)
    print(f"rank {rank}: saved", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
