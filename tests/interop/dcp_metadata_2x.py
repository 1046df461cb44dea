"""Writes a DCP checkpoint as PyTorch 2.x's FileSystemWriter would (no torch
2.x is needed): its .metadata names the 2.x classes.

    python3 dcp_metadata_2x.py OUT_DIR REFERENCE_PT [--zstd]

OUT_DIR/.metadata: pickle protocol 4 of
    torch.distributed.checkpoint.metadata.Metadata(state_dict_metadata,
        planner_data, storage_data, storage_meta, version="1.0.0")
  with ...metadata.TensorStorageMetadata / ChunkStorageMetadata /
  BytesStorageMetadata / MetadataIndex / TensorProperties (state: the tuple
  (dtype, layout, requires_grad, _MEM_FORMAT_ENCODING member pickled as
  builtins.getattr(...metadata._MEM_FORMAT_ENCODING, 'TORCH_CONTIGUOUS_FORMAT'),
  pin_memory)) / StorageMeta(checkpoint_id=pathlib.PosixPath(OUT_DIR as given),
  save_id=SAVE_ID, load_id=None, modules=[]), and storage_data values
  torch.distributed.checkpoint.filesystem._StorageInfo(relative_path, offset,
  length); like 2.x it leaves transform_descriptors out of the pickle when None.
  planner_data (2.x's flatten_state_dict mapping): {"a": ("a",), "b": ("b",),
  "meta": ("meta",), "opt.state.0.exp_avg": ("opt", "state", 0, "exp_avg")}
  (an int in a path is a list index; 2.x turns dict keys into str).
OUT_DIR/__0_0.distcp: every item of rank 0, concatenated as 2.x's default
single_file_per_rank writer does (bytes items first, then tensors):
    meta                 bytes item  torch.save({"epoch": 3})
    a                    float32 [4, 6]  chunks rows [0,2) and [2,4), each a
                                         torch.save of that (contiguous) slice
    b                    int32 [5]       one chunk
    opt.state.0.exp_avg  float32 [3]     one chunk
Values: element i (row-major) of KEY is i * 0.25 + len(KEY) (int32: i + len(KEY)).
REFERENCE_PT = torch.save({"a", "b", "opt.state.0.exp_avg": whole tensor}).
--zstd: every item as 2.x's ZStandard stream transform stores it: its bytes
through a zstd stream (the zstd tool reading a pipe writes frames without
their content size, as a streaming compressor does), its _StorageInfo with
transform_descriptors ["stream.zstd/1"] and the compressed offset and length.
"""
import dataclasses
import enum
import io
import pathlib
import pickle
import subprocess
import sys
import types

import torch

import dcp_common as dc

SAVE_ID = "2f1d7c3e-5a4b-4c1d-9e8f-0a1b2c3d4e5f"
MD, FS = "torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem"


@dataclasses.dataclass
class ChunkStorageMetadata:
    offsets: torch.Size
    sizes: torch.Size


class _MEM_FORMAT_ENCODING(enum.Enum):
    TORCH_CONTIGUOUS_FORMAT = 0
    TORCH_CHANNELS_LAST = 1
    TORCH_PRESERVE_FORMAT = 2


@dataclasses.dataclass
class TensorProperties:
    dtype: torch.dtype
    layout: torch.layout = torch.strided
    requires_grad: bool = False
    pin_memory: bool = False

    def __getstate__(self):
        return (self.dtype, self.layout, self.requires_grad,
                _MEM_FORMAT_ENCODING.TORCH_CONTIGUOUS_FORMAT, self.pin_memory)


@dataclasses.dataclass
class TensorStorageMetadata:
    properties: TensorProperties
    size: torch.Size
    chunks: list


@dataclasses.dataclass
class BytesStorageMetadata:
    pass


@dataclasses.dataclass
class StorageMeta:
    checkpoint_id: object = None
    save_id: object = None
    load_id: object = None
    modules: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Metadata:
    state_dict_metadata: dict
    planner_data: object = None
    storage_data: object = None
    storage_meta: object = None
    version: object = None


class MetadataIndex:
    """Its instance dict is what 2.x's frozen dataclass holds: fqn, index and,
    for tensors only, offset (a bytes item's offset stays the class default)."""
    offset = None

    def __init__(self, fqn, offset=None, index=None):
        self.fqn = fqn
        self.index = index
        if offset is not None:
            self.offset = torch.Size(offset)


@dataclasses.dataclass
class _StorageInfo:
    relative_path: str
    offset: int
    length: int
    transform_descriptors: object = None

    def __getstate__(self):
        return {k: v for k, v in vars(self).items() if v is not None}


def fake_modules():
    """Modules named as torch 2.x's, holding the stand-ins, so pickle names them."""
    package = types.ModuleType("torch.distributed.checkpoint")
    package.__path__ = []
    md, fs = types.ModuleType(MD), types.ModuleType(FS)
    for cls in (ChunkStorageMetadata, _MEM_FORMAT_ENCODING, TensorProperties, TensorStorageMetadata,
                BytesStorageMetadata, StorageMeta, Metadata, MetadataIndex):
        cls.__module__ = MD
        setattr(md, cls.__name__, cls)
    _StorageInfo.__module__ = FS
    fs._StorageInfo = _StorageInfo
    package.metadata, package.filesystem = md, fs
    return {"torch.distributed.checkpoint": package, MD: md, FS: fs}


def main(out_dir, reference, *options):
    compress = "--zstd" in options
    full = {"a": dc.value("a", (4, 6), torch.float32), "b": dc.value("b", (5,), torch.int32),
            "opt.state.0.exp_avg": dc.value("opt.state.0.exp_avg", (3,), torch.float32)}
    chunks = {"a": [((0, 0), (2, 6)), ((2, 0), (2, 6))], "b": [((0,), (5,))], "opt.state.0.exp_avg": [((0,), (3,))]}
    blob = io.BytesIO()
    items = []  # (MetadataIndex, payload bytes), in file order: bytes items first
    torch.save({"epoch": 3}, blob)
    items.append((MetadataIndex("meta"), blob.getvalue()))
    entries = {}
    for key in ("a", "b", "meta", "opt.state.0.exp_avg"):
        if key == "meta":
            entries[key] = BytesStorageMetadata()
            continue
        entries[key] = TensorStorageMetadata(TensorProperties(full[key].dtype), full[key].shape, [])
        for i, (offsets, sizes) in enumerate(chunks[key]):
            part = full[key]
            for axis, (o, n) in enumerate(zip(offsets, sizes)):
                part = part.narrow(axis, o, n)
            entries[key].chunks.append(ChunkStorageMetadata(torch.Size(offsets), torch.Size(sizes)))
            buffer = io.BytesIO()
            torch.save(part.clone(), buffer)
            items.append((MetadataIndex(key, offsets, i), buffer.getvalue()))
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    storage, position = {}, 0
    with open(out / "__0_0.distcp", "wb") as f:
        for index, payload in items:
            descriptors = None
            if compress:
                payload = subprocess.run(["zstd", "-q", "-c"], input=payload, capture_output=True, check=True).stdout
                descriptors = ["stream.zstd/1"]
            f.write(payload)
            storage[index] = _StorageInfo("__0_0.distcp", position, len(payload), descriptors)
            position += len(payload)
    planner = {"a": ("a",), "b": ("b",), "meta": ("meta",), "opt.state.0.exp_avg": ("opt", "state", 0, "exp_avg")}
    metadata = Metadata(entries, planner, storage, StorageMeta(pathlib.Path(out_dir), SAVE_ID), "1.0.0")
    fakes = fake_modules()
    saved = {name: sys.modules.get(name) for name in fakes}
    sys.modules.update(fakes)
    try:
        with open(out / ".metadata", "wb") as f:
            pickle.dump(metadata, f, protocol=4)
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    torch.save(full, reference)
    print(f"wrote {out / '.metadata'} and {len(items)} items in __0_0.distcp", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
