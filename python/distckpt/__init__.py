"""distckpt for Python: read and write distckpt checkpoints from PyTorch.

    import distckpt
    import torch.distributed.checkpoint as dcp   # torch 1.13: torch.distributed._shard.checkpoint
    dcp.load(state_dict, storage_reader=distckpt.FileSystemReader("ckpt"))   # trust_objects=True: see the class
    dcp.save(state_dict, storage_writer=distckpt.FileSystemWriter("ckpt2"))
    distckpt.load_plain_tensors("ckpt", keys=["embedding.word_embeddings.weight"])
"""
from ._errors import (CheckpointError, CommError, CorruptionError, Error, IoError, KeyMismatchError, ProtocolError,
                      ShardingError, TimeoutError, UntrustedObjectError, UsageError)
from ._reader import FileSystemReader
from ._tools import inspect, load_content_metadata, load_plain_tensors, verify
from ._writer import FileSystemWriter, __version__

__all__ = ["FileSystemReader", "FileSystemWriter", "inspect", "verify", "load_plain_tensors", "load_content_metadata",
           "Error", "UsageError", "ShardingError", "KeyMismatchError", "CheckpointError", "CorruptionError",
           "UntrustedObjectError", "IoError", "CommError", "TimeoutError", "ProtocolError", "__version__"]
