#!/usr/bin/env python3
"""Baseline: PyTorch distributed checkpoint (DCP, torch 1.13) save/load times
for the same state as bench/save_load_bench.cpp, so both can be compared in
one run on one file system. Start one process per rank with RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT set (bench/dcp_baseline.sh does that).

Figures are medians over --reps, timed on rank 0 between barriers:
  dcp_save          save_state_dict, one file per rank, fsync'd
  dcp_load          load into the saving layout (row shards)
  dcp_reshard_load  load into column shards (max(world, 2) parts)
With --distckpt, each repetition also saves and loads the same state
through the Python package's distckpt.FileSystemWriter/Reader (py_save,
py_load, py_reshard_load, interleaved with DCP's own, so ratios come from
one run).
Loads start from files read once, then evicted from the page cache (see
evict), and write into destinations allocated and zero-filled once, so page
faults are not timed.
"""
import argparse
import cProfile
import os
import pstats
import shutil
import statistics
import sys
import time

import torch
import torch.distributed as dist


def _import_dcp():
    # Under Python 3.11, torch 1.13's DCP imports only with the workaround in
    # distckpt's Python package (python/distckpt/_dcp.py); dcp_baseline.sh
    # puts the build's package on PYTHONPATH.
    from distckpt._dcp import dcp
    from torch.distributed._shard import sharded_tensor as st
    from torch.distributed._shard.sharding_spec import ChunkShardingSpec
    return dcp, st, ChunkShardingSpec


dcp, st, ChunkShardingSpec = _import_dcp()

PER_LAYER = [  # (name, rows in units of h, cols in units of h), as in make_model
    ("self_attention.linear_qkv.weight", 3, 1),
    ("self_attention.linear_proj.weight", 1, 1),
    ("mlp.linear_fc1.weight", 4, 1),
    ("mlp.linear_fc2.weight", 1, 4),
]


def make_model(total_mb, h, rank, world):
    """key -> (global shape, this rank's rows); the same keys, shapes and row
    split as make_model in save_load_bench.cpp."""
    model, global_bytes, layer = {}, 0, 0
    while global_bytes < total_mb << 20:
        for name, r, c in PER_LAYER:
            rows, cols = r * h, c * h
            assert rows % world == 0, f"{rows} rows do not split over {world} ranks"
            model[f"decoder.layers.{layer}.{name}"] = (
                (rows, cols), torch.rand(rows // world, cols))
            global_bytes += rows * cols * 4
        layer += 1
    return model, global_bytes


def sharded(shape, spec, rank, tensors):
    """A ShardedTensor over `tensors` (this rank's shards, in spec order).
    Built from global metadata that every rank computes alike, so there is no
    collective per tensor and no copy."""
    props = st.TensorProperties(dtype=torch.float32)
    meta = spec.build_metadata(torch.Size(shape), props)
    local = [m for m in meta.shards_metadata if m.placement.rank() == rank]
    assert len(local) == len(tensors)
    shards = [st.Shard(t, m) for t, m in zip(tensors, local)]
    return st.ShardedTensor._init_from_local_shards_and_global_metadata(
        shards, meta, sharding_spec=spec)


def placements(parts, world):
    return [f"rank:{p % world}/cpu" for p in range(parts)]


def row_state(model, rank, world, fill=None):
    spec = ChunkShardingSpec(dim=0, placements=placements(world, world))
    return {k: sharded(shape, spec, rank, [t if fill is None else fill(t.shape)])
            for k, (shape, t) in model.items()}


def column_state(model, rank, world):
    # Part p of max(world, 2) column parts lives on rank p % world; with one
    # rank both halves are local shards of rank 0.
    parts = max(world, 2)
    spec = ChunkShardingSpec(dim=1, placements=placements(parts, world))
    state = {}
    for k, ((rows, cols), _) in model.items():
        assert cols % parts == 0
        mine = [torch.zeros(rows, cols // parts) for p in range(rank, parts, world)]
        state[k] = sharded((rows, cols), spec, rank, mine)
    return state


def evict(path):
    """As bench/save_load_bench.cpp does before every timed read: every file
    is read once (the virtual disk's host caches what was read before, so a
    first read of fresh data is much slower than any later one), then this
    machine's page cache is emptied (drop_caches when root, else fadvise)."""
    dist.barrier()
    if dist.get_rank() == 0:
        files = [os.path.join(d, name) for d, _, names in os.walk(path) for name in names]
        for name in files:
            with open(name, "rb") as f:
                while f.read(16 << 20):
                    pass
        os.sync()
        try:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("1")
        except OSError:
            for name in files:
                fd = os.open(name, os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
    dist.barrier()


def verify(model, same, resharded, rank, world):
    parts = max(world, 2)
    for k, ((rows, cols), saved) in model.items():
        if not torch.equal(same[k].local_shards()[0].tensor, saved):
            return f"same-layout load differs for {k}"
        if resharded is None:
            continue
        lr, pc = rows // world, cols // parts
        for shard in resharded[k].local_shards():
            c0 = shard.metadata.shard_offsets[1]
            # Only this rank's saved rows are at hand to compare against.
            got = shard.tensor[rank * lr:(rank + 1) * lr]
            if not torch.equal(got, saved[:, c0:c0 + pc]):
                return f"resharded load differs for {k} columns {c0}:{c0 + pc}"
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=int, default=2048, help="global state size, MiB")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", default="/tmp/dcp-bench", help="scratch directory")
    ap.add_argument("--distckpt", action="store_true",
                    help="also time distckpt.FileSystemWriter/Reader on the same state")
    ap.add_argument("--keep", action="store_true",
                    help="keep PyTorch's checkpoint (DIR/ckpt) for distckpt's own reader "
                         "(bench/dcp_native_load.sh)")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="cProfile rank 0's first save and load, print top N")
    args = ap.parse_args()

    torch.set_num_threads(1)  # 2 cores, up to 4 ranks
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(rank)

    model, global_bytes = make_model(args.mb, args.hidden, rank, world)
    source = row_state(model, rank, world)
    # Destinations once, zero-filled, so their pages are touched before timing.
    same = row_state(model, rank, world, fill=torch.zeros)
    resharded = column_state(model, rank, world)
    ckpt = os.path.join(args.dir, "ckpt")
    if rank == 0:
        shutil.rmtree(args.dir, ignore_errors=True)
        os.makedirs(args.dir)

    times = {"dcp_save": [], "dcp_load": [], "dcp_reshard_load": []}
    if args.distckpt:
        import distckpt
        times.update({"py_save": [], "py_load": [], "py_reshard_load": []})
        ours = os.path.join(args.dir, "distckpt")
    notes = {}

    def timed(key, fn, rep):
        dist.barrier()
        prof = cProfile.Profile() if args.profile and rank == 0 and rep == 0 else None
        t0 = time.perf_counter()
        if prof:
            prof.enable()
        try:
            fn()
        except Exception as e:  # a DCP limitation: report it, don't die
            notes[key] = f"{type(e).__name__}: {e}".splitlines()[0][:200]
        if prof:
            prof.disable()
        dist.barrier()
        times[key].append(time.perf_counter() - t0)
        if prof:
            print(f"\n## cProfile: {key}, rank 0, first rep\n```")
            pstats.Stats(prof, stream=sys.stdout).sort_stats("cumulative").print_stats(args.profile)
            print("```")

    for rep in range(args.reps):
        if rank == 0:
            shutil.rmtree(ckpt, ignore_errors=True)
        dist.barrier()
        timed("dcp_save", lambda: dcp.save_state_dict(
            source, dcp.FileSystemWriter(ckpt, single_file_per_rank=True, sync_files=True)), rep)
        evict(ckpt)
        timed("dcp_load", lambda: dcp.load_state_dict(same, dcp.FileSystemReader(ckpt)), rep)
        evict(ckpt)
        timed("dcp_reshard_load",
              lambda: dcp.load_state_dict(resharded, dcp.FileSystemReader(ckpt)), rep)
        if args.distckpt:
            if rank == 0:
                shutil.rmtree(ours, ignore_errors=True)
            dist.barrier()
            timed("py_save", lambda: dcp.save_state_dict(source, distckpt.FileSystemWriter(ours)), rep)
            if rep == 0:  # what verify() checks below must come from distckpt's reader
                for st_ in list(same.values()) + list(resharded.values()):
                    for shard in st_.local_shards():
                        shard.tensor.zero_()
            evict(ours)
            timed("py_load", lambda: dcp.load_state_dict(same, distckpt.FileSystemReader(ours)), rep)
            evict(ours)
            timed("py_reshard_load", lambda: dcp.load_state_dict(resharded, distckpt.FileSystemReader(ours)), rep)
        if rep == 0:
            err = verify(model, same, None if "dcp_reshard_load" in notes else resharded,
                         rank, world)
            failed = [None] * world
            dist.all_gather_object(failed, err)
            if any(failed):
                if rank == 0:
                    for r, e in enumerate(failed):
                        if e:
                            print(f"VERIFY FAILED on rank {r}: {e}", file=sys.stderr)
                sys.exit(1)

    if rank == 0:
        gb = global_bytes / 1e9
        print(f"\nPyTorch {torch.__version__} DCP: {gb:.3f} GB global, {len(model)} tensors, "
              f"world {world}, {args.reps} reps, hidden {args.hidden}, dir {args.dir}\n")
        print("| operation | seconds (median) | GB/s |\n|---|---|---|")
        result = []
        for key, ts in times.items():
            if key in notes:
                print(f"| {key} | n/a | n/a ({notes[key]}) |")
                result.append(f"{key}_s=n/a")
                continue
            s = statistics.median(ts)
            print(f"| {key} | {s:.3f} | {gb / s:.3f} |")
            result.append(f"{key}_s={s:.4f}")
        if args.distckpt:
            print("\n| distckpt Python package / PyTorch DCP (same run) | ratio of speeds |\n|---|---|")
            for op in ("save", "load", "reshard_load"):
                if f"dcp_{op}" not in notes and f"py_{op}" not in notes:
                    ratio = statistics.median(times[f"dcp_{op}"]) / statistics.median(times[f"py_{op}"])
                    print(f"| {op} | {ratio:.2f}x |")
                    result.append(f"py_vs_dcp_{op}={ratio:.3f}")
        print("\nRESULT " + " ".join(result) + f" world={world} gb={gb:.4f}")
        if args.keep:
            if args.distckpt:
                shutil.rmtree(ours, ignore_errors=True)
        else:
            shutil.rmtree(args.dir, ignore_errors=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
