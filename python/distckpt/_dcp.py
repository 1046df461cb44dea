"""Every difference between PyTorch versions lives here: where DCP's classes
are (torch 1.13: torch.distributed._shard.checkpoint; 2.x:
torch.distributed.checkpoint), how 1.13 is imported under Python 3.11, and
the names of the save and load entry points. The reader and writer implement
both interfaces (1.13's `init`, 2.x's `set_up_storage_*`, `reset`,
`validate_checkpoint_id`, `storage_meta`) and import everything from here."""
import dataclasses

import torch


def _import_torch_113():
    # torch 1.13 declares `tensor_properties: TensorProperties =
    # field(default=TensorProperties())`; Python 3.11 rejects a default whose
    # class is unhashable ("mutable default"). While torch's dataclasses are
    # defined, such a class of torch.distributed gets the identity hash: the
    # default is shared and never mutated, and nothing hashes these objects.
    original = dataclasses._get_field

    def get_field(cls, name, *args, **kwargs):
        default = cls.__dict__.get(name)
        if isinstance(default, dataclasses.Field):
            default = default.default
        kind = type(default)
        if dataclasses.is_dataclass(kind) and kind.__hash__ is None and kind.__module__.startswith(
                "torch.distributed"):
            kind.__hash__ = object.__hash__
        return original(cls, name, *args, **kwargs)

    dataclasses._get_field = get_field
    try:
        import torch.distributed._shard.checkpoint as dcp
        from torch.distributed._shard.sharded_tensor.metadata import TensorProperties
    finally:
        dataclasses._get_field = original
    return dcp, TensorProperties


TORCH_2 = int(torch.__version__.split(".")[0]) >= 2
if TORCH_2:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorProperties
    save = dcp.save
    load = dcp.load
else:
    dcp, TensorProperties = _import_torch_113()
    save = dcp.save_state_dict
    load = dcp.load_state_dict

# The same names in both versions, in submodules of `dcp`.
StorageReader, StorageWriter, WriteResult = dcp.storage.StorageReader, dcp.storage.StorageWriter, dcp.storage.WriteResult
Metadata, MetadataIndex = dcp.metadata.Metadata, dcp.metadata.MetadataIndex
TensorStorageMetadata = dcp.metadata.TensorStorageMetadata
BytesStorageMetadata = dcp.metadata.BytesStorageMetadata
ChunkStorageMetadata = dcp.metadata.ChunkStorageMetadata
LoadItemType, WriteItemType = dcp.planner.LoadItemType, dcp.planner.WriteItemType
PyTorchFileSystemReader = dcp.FileSystemReader
PyTorchFileSystemWriter = dcp.FileSystemWriter


def tensor_properties(dtype: torch.dtype):
    return TensorProperties(dtype=dtype)


def storage_meta(checkpoint_id):
    """2.x's StorageMeta for a writer (None where the class does not exist)."""
    try:
        from torch.distributed.checkpoint.metadata import StorageMeta
    except ImportError:
        return None
    return StorageMeta(checkpoint_id=checkpoint_id)


# torch 1.13 and 2.x: torch.storage.TypedStorage (1.12: _TypedStorage).
TypedStorage = getattr(torch.storage, "TypedStorage", None) or getattr(torch.storage, "_TypedStorage")


def typed_storage(buffer: bytearray, dtype: torch.dtype):
    """A CPU storage of DTYPE over BUFFER's bytes (shared, not copied), as
    torch.load's persistent ids give _rebuild_tensor_v2."""
    raw = torch.frombuffer(buffer, dtype=torch.uint8) if len(buffer) else torch.empty(0, dtype=torch.uint8)
    if hasattr(raw, "untyped_storage"):  # 2.x
        untyped = raw.untyped_storage()
    else:
        typed = raw.storage()
        untyped = typed.untyped() if hasattr(typed, "untyped") else typed._untyped()
    try:
        return TypedStorage(wrap_storage=untyped, dtype=dtype, _internal=True)  # 2.x: no deprecation warning
    except TypeError:
        return TypedStorage(wrap_storage=untyped, dtype=dtype)


def done(value=None):
    future = torch.futures.Future()
    future.set_result(value)
    return future
