"""Writes a Megatron-Core `torch_dist` checkpoint directory without Megatron
(1 process, no process group).

    python3 megatron_torch_dist.py OUT_DIR REFERENCE_PT

OUT_DIR/metadata.json  {"sharded_backend": "torch_dist", "sharded_backend_version": 1,
                        "common_backend": "torch", "common_backend_version": 1}
OUT_DIR/common.pt      torch.save({"iteration": 10, "checkpoint_version": 3.0, "args_note": "x"})
OUT_DIR/.metadata, __0_0.distcp  a DCP checkpoint written by PyTorch's own
FileSystemWriter (no_dist, single_file_per_rank: all items in __0_0.distcp,
bytes items first) holding
    decoder.layers.self_attention.linear_qkv.weight  float32  [2, 12, 8] one chunk
                                                     (layers stacked on dim 0)
    embedding.word_embeddings.weight                 bfloat16 [16, 8]    one chunk
    optimizer.rng_state/shard_0_2   bytes item torch.save([{"seed": 1234}])
    optimizer.rng_state/shard_1_2   bytes item torch.save([{"seed": 1235}])
The sharded objects' keys are Megatron's ShardedObject unique keys
(KEY/shard_OFFSET_SHAPE) and, as Megatron does, each item holds torch.save of
the LIST of the rank's objects with that key (here one dict).
Tensor values: element i (row-major) of KEY is i * 0.25 + len(KEY) (float64, cast).
.metadata is then re-pickled (protocol 4) as
megatron.core.dist_checkpointing.strategies.torch.MCoreMetadata, a Metadata
subclass with the same fields plus mcore_data = {}.
REFERENCE_PT = torch.save({tensor key: whole tensor}) for the two tensors.
"""
import dataclasses
import json
import os
import pickle
import sys
import types

import torch

import dcp_common as dc

MCORE = "megatron.core.dist_checkpointing.strategies.torch"
TENSORS = {"decoder.layers.self_attention.linear_qkv.weight": ((2, 12, 8), torch.float32),
           "embedding.word_embeddings.weight": ((16, 8), torch.bfloat16)}


@dataclasses.dataclass
class MCoreMetadata(dc.dcp.metadata.Metadata):
    mcore_data: dict = dataclasses.field(default_factory=dict)


def register_mcore():
    """Megatron's module path (and its parent packages) in sys.modules."""
    parts = MCORE.split(".")
    for n in range(1, len(parts) + 1):
        name = ".".join(parts[:n])
        if name not in sys.modules:
            module = types.ModuleType(name)
            module.__path__ = []
            sys.modules[name] = module
    MCoreMetadata.__module__ = MCORE
    sys.modules[MCORE].MCoreMetadata = MCoreMetadata


def main(out_dir, reference):
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "metadata.json"), "w") as f:
        json.dump({"sharded_backend": "torch_dist", "sharded_backend_version": 1,
                   "common_backend": "torch", "common_backend_version": 1}, f)
    torch.save({"iteration": 10, "checkpoint_version": 3.0, "args_note": "x"}, os.path.join(out_dir, "common.pt"))
    full = {key: dc.value(key, shape, dtype) for key, (shape, dtype) in TENSORS.items()}
    state = dict(full)
    for k in range(2):
        state[f"optimizer.rng_state/shard_{k}_2"] = [{"seed": 1234 + k}]
    dc.save(state, dc.dcp.FileSystemWriter(out_dir, single_file_per_rank=True), no_dist=True)

    path = os.path.join(out_dir, ".metadata")
    with open(path, "rb") as f:
        plain = pickle.load(f)
    register_mcore()
    fields = {field.name: getattr(plain, field.name) for field in dataclasses.fields(dc.dcp.metadata.Metadata)}
    with open(path, "wb") as f:
        pickle.dump(MCoreMetadata(**fields, mcore_data={}), f, protocol=4)
    torch.save(full, reference)

    # PyTorch's own reader, with the class importable, loads it unchanged.
    loaded = {key: torch.zeros_like(t) for key, t in full.items()}
    loaded.update({f"optimizer.rng_state/shard_{k}_2": None for k in range(2)})
    reader = dc.dcp.FileSystemReader(out_dir)
    if type(reader.read_metadata()).__name__ != "MCoreMetadata":
        dc.fail("the re-pickled .metadata is not an MCoreMetadata")
    dc.load(loaded, reader, no_dist=True)
    for key, tensor in full.items():
        if not torch.equal(loaded[key], tensor):
            dc.fail(f"{key}: PyTorch's reader loads other values")
    for k in range(2):
        if loaded[f"optimizer.rng_state/shard_{k}_2"] != [{"seed": 1234 + k}]:
            dc.fail(f"shard_{k}_2: PyTorch's reader loads {loaded[f'optimizer.rng_state/shard_{k}_2']}")
    print(f"wrote {out_dir}; PyTorch's FileSystemReader loads it back", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
