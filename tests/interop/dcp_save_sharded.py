"""A PyTorch job saves one sharded state dict twice with
torch.distributed.checkpoint: through distckpt.FileSystemWriter into
DISTCKPT_DIR and through PyTorch's own FileSystemWriter into TORCH_DIR.
tests/e2e/python_bridge_test.cpp loads the first with the C++ runtime under
another layout and compares it with the second (via dcp_resave_plain.py).

    RANK=.. WORLD_SIZE=.. MASTER_ADDR=.. MASTER_PORT=.. python3 dcp_save_sharded.py DISTCKPT_DIR TORCH_DIR

The state (keys, shapes and values known to the C++ test):
    layers.0.weight  float32  [8, 6]   rows over the ranks
    layers.1.weight  bfloat16 [6, 8]   columns over the ranks
    embedding        float32  [12, 4]  rows over the ranks
    bias             float32  [6]      a plain tensor (the coordinator writes it)
    step = 7, config = {"hidden": 8, "name": "tiny", "betas": [0.9, 0.95]}
Values: element i (row-major) of KEY is i * 0.25 + len(KEY) (rounded to the dtype).
"""
import sys

import torch
import torch.distributed as dist

import distckpt
from distckpt import _dcp
from torch.distributed._shard import sharded_tensor as st
from torch.distributed._shard.sharding_spec import ChunkShardingSpec

TENSORS = {"layers.0.weight": ((8, 6), torch.float32, 0), "layers.1.weight": ((6, 8), torch.bfloat16, 1),
           "embedding": ((12, 4), torch.float32, 0), "bias": ((6,), torch.float32, None)}


def value(key, shape, dtype):
    n = 1
    for extent in shape:
        n *= extent
    return (torch.arange(n, dtype=torch.float64) * 0.25 + len(key)).reshape(shape).to(dtype)


def sharded(full, dim, rank, world):
    spec = ChunkShardingSpec(dim=dim, placements=[f"rank:{p}/cpu" for p in range(world)])
    meta = spec.build_metadata(full.shape, st.TensorProperties(dtype=full.dtype))
    shards = []
    for m in meta.shards_metadata:
        if m.placement.rank() == rank:
            t = full
            for axis, (o, n) in enumerate(zip(m.shard_offsets, m.shard_sizes)):
                t = t.narrow(axis, o, n)
            shards.append(st.Shard(t.clone(), m))
    return st.ShardedTensor._init_from_local_shards_and_global_metadata(shards, meta, sharding_spec=spec)


def state(rank, world):
    sd = {"step": 7, "config": {"hidden": 8, "name": "tiny", "betas": [0.9, 0.95]}}
    for key, (shape, dtype, dim) in TENSORS.items():
        full = value(key, shape, dtype)
        sd[key] = full if dim is None else sharded(full, dim, rank, world)
    return sd


def main(distckpt_dir, torch_dir):
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    _dcp.save(state(rank, world), storage_writer=distckpt.FileSystemWriter(distckpt_dir))
    _dcp.save(state(rank, world), storage_writer=_dcp.PyTorchFileSystemWriter(torch_dir))
    print(f"rank {rank}: saved", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
