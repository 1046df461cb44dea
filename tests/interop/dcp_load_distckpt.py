"""A PyTorch job loads a distckpt checkpoint (saved by the C++ runtime) with
torch.distributed.checkpoint and distckpt.FileSystemReader, into its own
layout: tensors alternately row-sharded, column-sharded (ChunkShardingSpec
over every rank) and plain, plus the common "iteration". Every local value is
compared with REFERENCE, a torch.save file of the same checkpoint written by
the C++ export (`distckpt convert --to torch`), so nothing of the Python
reader checks itself.

    RANK=.. WORLD_SIZE=.. MASTER_ADDR=.. MASTER_PORT=.. python3 dcp_load_distckpt.py CKPT REFERENCE.pt ITERATION
Prints "rank R: N sharded, M plain tensors equal" (exit 1 on a difference).
"""
import sys

import torch
import torch.distributed as dist

import distckpt
from distckpt import _dcp
from torch.distributed._shard import sharded_tensor as st
from torch.distributed._shard.sharding_spec import ChunkShardingSpec


def sharded(shape, dtype, dim, rank, world):
    spec = ChunkShardingSpec(dim=dim, placements=[f"rank:{p}/cpu" for p in range(world)])
    meta = spec.build_metadata(torch.Size(shape), st.TensorProperties(dtype=dtype))
    shards = [st.Shard(torch.full(m.shard_sizes, -1).to(dtype), m) for m in meta.shards_metadata
              if m.placement.rank() == rank]
    return st.ShardedTensor._init_from_local_shards_and_global_metadata(shards, meta, sharding_spec=spec)


def main(ckpt, reference, iteration):
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    reader = distckpt.FileSystemReader(ckpt)
    md = reader.read_metadata().state_dict_metadata
    state = {"iteration": None}
    for i, key in enumerate(sorted(distckpt.inspect(ckpt)["tensors"])):
        entry = md[key]
        shape, dtype = tuple(entry.size), entry.properties.dtype
        dim = [0, 1, None][i % 3]
        if dim is not None and len(shape) > dim and shape[dim] >= world:
            state[key] = sharded(shape, dtype, dim, rank, world)
        else:
            state[key] = torch.full(shape, -1).to(dtype)
    _dcp.load(state, storage_reader=reader)

    want = torch.load(reference)
    counts = [0, 0]
    for key, value in state.items():
        if key == "iteration":
            assert value == int(iteration), f"iteration {value}, expected {iteration}"
            continue
        if isinstance(value, st.ShardedTensor):
            for shard in value.local_shards():
                region = want[key]
                for axis, (o, n) in enumerate(zip(shard.metadata.shard_offsets, shard.metadata.shard_sizes)):
                    region = region.narrow(axis, o, n)
                assert torch.equal(shard.tensor, region), f"rank {rank}: shard of {key} at " \
                                                          f"{shard.metadata.shard_offsets} differs"
            counts[0] += 1
        else:
            assert torch.equal(value, want[key]), f"rank {rank}: {key} differs"
            counts[1] += 1
    print(f"rank {rank}: {counts[0]} sharded, {counts[1]} plain tensors equal", flush=True)
    dist.barrier()


if __name__ == "__main__":
    main(*sys.argv[1:])
