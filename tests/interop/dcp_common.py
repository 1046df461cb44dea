"""Shared helpers of the DCP interop fixture scripts. Imports PyTorch's
distributed checkpoint (torch 1.13: torch.distributed._shard.checkpoint,
torch >= 2: torch.distributed.checkpoint) without importing distckpt, so the
scripts run without the built bindings.

    value(key, shape, dtype)  the value rule every fixture uses: element i
                              (row-major) is i * 0.25 + len(key), computed in
                              float64 and cast; integer dtypes: i + len(key)
    sharded(full, boxes, rank, world, spec)
                              a ShardedTensor whose shards are the boxes
                              [(offsets, sizes, owner rank)]; rank keeps its own
    chunk_boxes(shape, dim, world)  the boxes ChunkShardingSpec gives
    save / load               save_state_dict / load_state_dict (1.13) or
                              save / load (2.x)
    CompatReader              PyTorch's FileSystemReader that also reads a
                              .metadata pickled with 2.x or Megatron class names
"""
import dataclasses
import os
import pickle
import sys

import torch
import torch.distributed as dist

TORCH_2 = int(torch.__version__.split(".")[0]) >= 2


def _import_dcp_113():
    """torch 1.13 declares `tensor_properties: TensorProperties =
    field(default=TensorProperties())`, which Python 3.11 rejects as a mutable
    default (the dataclass is unhashable). While DCP is imported, give such
    torch.distributed dataclasses object's identity hash, then restore."""
    real = dataclasses._get_field

    def patched(cls, name, *args, **kwargs):
        default = cls.__dict__.get(name)
        if isinstance(default, dataclasses.Field):
            default = default.default
        kind = type(default)
        if (dataclasses.is_dataclass(kind) and kind.__hash__ is None
                and kind.__module__.startswith("torch.distributed")):
            kind.__hash__ = object.__hash__
        return real(cls, name, *args, **kwargs)

    dataclasses._get_field = patched
    try:
        import torch.distributed._shard.checkpoint as module
    finally:
        dataclasses._get_field = real
    return module


if TORCH_2:
    import torch.distributed.checkpoint as dcp
else:
    dcp = _import_dcp_113()

from torch.distributed._shard import sharded_tensor as st  # noqa: E402 (after the patched import)
from torch.distributed._shard.metadata import ShardMetadata  # noqa: E402
from torch.distributed._shard.sharding_spec import ChunkShardingSpec, EnumerableShardingSpec  # noqa: E402

TensorStorageMetadata = dcp.metadata.TensorStorageMetadata
BytesStorageMetadata = dcp.metadata.BytesStorageMetadata


def save(state, writer, no_dist=False):
    if TORCH_2:  # 2.x infers no_dist from whether a process group exists
        return dcp.save(state, storage_writer=writer)
    return dcp.save_state_dict(state, storage_writer=writer, no_dist=no_dist)


def load(state, reader, no_dist=False):
    if TORCH_2:
        return dcp.load(state, storage_reader=reader)
    return dcp.load_state_dict(state, storage_reader=reader, no_dist=no_dist)


def value(key, shape, dtype):
    n = 1
    for extent in shape:
        n *= extent
    if dtype.is_floating_point:
        flat = torch.arange(n, dtype=torch.float64) * 0.25 + len(key)
    else:
        flat = torch.arange(n, dtype=torch.int64) + len(key)
    return flat.reshape(shape).to(dtype)


def init_gloo():
    """Joins the job distckpt-launch started (RANK, WORLD_SIZE, MASTER_ADDR,
    MASTER_PORT), or, run without it, a job of one rank; returns (rank, world)."""
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group("gloo")
    else:
        store = dist.HashStore()
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    return dist.get_rank(), dist.get_world_size()


def chunk_boxes(shape, dim, world):
    """(offsets, sizes, rank) of the shards ChunkShardingSpec(dim) makes."""
    spec = ChunkShardingSpec(dim=dim, placements=[f"rank:{r}/cpu" for r in range(world)])
    meta = spec.build_metadata(torch.Size(shape), st.TensorProperties(dtype=torch.float32))
    return [(m.shard_offsets, m.shard_sizes, m.placement.rank()) for m in meta.shards_metadata], spec


def sharded(full, boxes, rank, spec=None):
    """A ShardedTensor of `full` cut into `boxes`; this rank holds copies of
    its own boxes (several when it owns several)."""
    metas = [ShardMetadata(list(o), list(s), f"rank:{r}/cpu") for o, s, r in boxes]
    if spec is None:
        spec = EnumerableShardingSpec(metas)
    global_meta = st.ShardedTensorMetadata(metas, full.shape, st.TensorProperties(dtype=full.dtype))
    local = []
    for m in metas:
        if m.placement.rank() == rank:
            part = full
            for axis, (o, n) in enumerate(zip(m.shard_offsets, m.shard_sizes)):
                part = part.narrow(axis, o, n)
            local.append(st.Shard(part.clone(), m))
    return st.ShardedTensor._init_from_local_shards_and_global_metadata(local, global_meta, sharding_spec=spec)


@dataclasses.dataclass
class StorageMeta:
    """Stand-in for 2.x's StorageMeta when 1.13 reads a 2.x .metadata."""
    checkpoint_id: object = None
    save_id: object = None
    load_id: object = None
    modules: list = dataclasses.field(default_factory=list)


class _CompatUnpickler(pickle.Unpickler):
    """Under 1.13, maps the class names torch 2.x and Megatron pickle to 1.13's."""

    def find_class(self, module, name):
        if not TORCH_2:
            from torch.distributed._shard.sharded_tensor import metadata as st_meta
            if module == "torch.distributed.checkpoint.metadata":
                if name == "TensorProperties":
                    return st_meta.TensorProperties
                if name == "_MEM_FORMAT_ENCODING":
                    return st_meta.MEM_FORMAT_ENCODING
                if name == "StorageMeta":
                    return StorageMeta
                return getattr(dcp.metadata, name)
            if module == "torch.distributed.checkpoint.filesystem":
                return getattr(dcp.filesystem, name)
        if module.startswith("megatron.") and name == "MCoreMetadata":
            return dcp.metadata.Metadata
        return super().find_class(module, name)


def read_metadata(directory):
    with open(os.path.join(directory, ".metadata"), "rb") as f:
        return _CompatUnpickler(f).load()


class CompatReader(dcp.FileSystemReader):
    def read_metadata(self):
        return read_metadata(self.path)


def fail(message):
    print(f"FAIL: {message}", file=sys.stderr, flush=True)
    sys.exit(1)
