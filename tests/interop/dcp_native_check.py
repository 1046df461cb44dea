"""Loads the DCP checkpoint in DIR with PyTorch's OWN FileSystemReader and
compares every tensor with REFERENCE_PT (torch.save({dotted key: tensor})).

    python3 dcp_native_check.py DIR REFERENCE_PT [--keys k1,k2]
    distckpt-launch -n 2 -- python3 dcp_native_check.py DIR REFERENCE_PT [--keys ...]

Checks the reference's keys (or only --keys). Each is loaded into a fresh
whole tensor of zeros of the reference's shape and dtype (no_dist=True); the
checkpoint's recorded size and dtype must match too. A key absent from the
checkpoint whose dotted prefix is a bytes item (torch 1.13 stores a nested
dict whole: "nested.inner.t" lives in bytes item "nested") is looked up inside
that loaded object. The .metadata may name torch 1.13, torch 2.x or Megatron
(MCoreMetadata) classes. Prints "tensors equal N" (rank 0) on success.
Under distckpt-launch with 2+ ranks each rank also loads every tensor key of
the checkpoint with 1+ dimensions as a ShardedTensor split by rows
(ChunkShardingSpec dim 0) and, with 2+ dimensions, by columns (dim 1), and
compares its shards; prints "rank R: sharded tensors equal M".
Exits 1 with "FAIL: ..." on stderr on any difference.
"""
import os
import sys

import torch

import dcp_common as dc


def locate(md, key):
    """(entry name in the checkpoint, path inside a bytes entry or [])."""
    if key in md:
        return key, []
    parts = key.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        prefix = ".".join(parts[:cut])
        if isinstance(md.get(prefix), dc.BytesStorageMetadata):
            return prefix, parts[cut:]
    dc.fail(f"{key}: not in the checkpoint (entries: {sorted(md)})")


def descend(obj, path, key):
    for part in path:
        if isinstance(obj, dict):
            obj = obj[part] if part in obj else obj.get(int(part)) if part.isdigit() else None
        elif isinstance(obj, (list, tuple)) and part.isdigit() and int(part) < len(obj):
            obj = obj[int(part)]
        else:
            obj = None
        if obj is None:
            dc.fail(f"{key}: no '{part}' inside its bytes item")
    if not isinstance(obj, torch.Tensor):
        dc.fail(f"{key}: the bytes item holds {type(obj).__name__}, not a tensor")
    return obj


def compare(key, got, want, where=""):
    if got.dtype != want.dtype or got.shape != want.shape:
        dc.fail(f"{key}{where}: got {got.dtype} {list(got.shape)}, want {want.dtype} {list(want.shape)}")
    if not torch.equal(got, want):
        bad = (got != want).nonzero()[0].tolist()
        dc.fail(f"{key}{where}: differs first at {bad}: {got[tuple(bad)].item()} != {want[tuple(bad)].item()}")


def check_whole(directory, ref, keys):
    md = dc.read_metadata(directory).state_dict_metadata
    state, inside = {}, {}
    for key in keys:
        name, path = locate(md, key)
        if path:
            state[name] = None
            inside[key] = (name, path)
            continue
        entry = md[name]
        if not isinstance(entry, dc.TensorStorageMetadata):
            dc.fail(f"{key}: a bytes item in the checkpoint, the reference has a tensor")
        if entry.properties.dtype != ref[key].dtype or list(entry.size) != list(ref[key].shape):
            dc.fail(f"{key}: checkpoint records {entry.properties.dtype} {list(entry.size)}, "
                    f"reference {ref[key].dtype} {list(ref[key].shape)}")
        state[key] = torch.zeros_like(ref[key])
    dc.load(state, dc.CompatReader(directory), no_dist=True)
    for key in keys:
        got = descend(state[inside[key][0]], inside[key][1], key) if key in inside else state[key]
        compare(key, got, ref[key])
    return md


def check_sharded(directory, ref, keys, md, rank, world):
    count = 0
    for key in keys:  # the same order on every rank: each load is collective
        entry = md.get(key)
        if not isinstance(entry, dc.TensorStorageMetadata):
            continue
        for dim in range(min(2, len(entry.size))):
            if entry.size[dim] < world:
                continue
            boxes, spec = dc.chunk_boxes(entry.size, dim, world)
            state = {key: dc.sharded(torch.zeros_like(ref[key]), boxes, rank, spec)}
            dc.load(state, dc.CompatReader(directory))
            for shard in state[key].local_shards():
                want = ref[key]
                for axis, (o, n) in enumerate(zip(shard.metadata.shard_offsets, shard.metadata.shard_sizes)):
                    want = want.narrow(axis, o, n)
                compare(key, shard.tensor, want, f" (split on dim {dim}, shard at {shard.metadata.shard_offsets})")
            count += 1
    return count


def main(directory, reference, *flags):
    ref = torch.load(reference)
    keys = list(ref)
    if flags:
        if len(flags) != 2 or flags[0] != "--keys":
            dc.fail("usage: dcp_native_check.py DIR REFERENCE_PT [--keys k1,k2]")
        keys = [k for k in flags[1].split(",") if k]
        missing = [k for k in keys if k not in ref]
        if missing:
            dc.fail(f"--keys names tensors the reference lacks: {missing}")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = 0
    if world > 1:
        rank, world = dc.init_gloo()
    md = check_whole(directory, ref, keys)
    if rank == 0:
        print(f"tensors equal {len(keys)}", flush=True)
    if world > 1:
        count = check_sharded(directory, ref, keys, md, rank, world)
        print(f"rank {rank}: sharded tensors equal {count}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
