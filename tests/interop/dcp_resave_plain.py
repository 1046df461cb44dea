"""Loads a checkpoint PyTorch's own FileSystemWriter wrote back into plain
tensors and values (PyTorch's reader, one process) and saves them with
distckpt.FileSystemWriter, so the C++ runtime can compare it with what the
Python writer saved from the same state.

    python3 dcp_resave_plain.py TORCH_DIR OUT_DIR
"""
import sys

import torch

import distckpt
from distckpt import _dcp


def main(torch_dir, out_dir):
    reader = _dcp.PyTorchFileSystemReader(torch_dir)
    md = reader.read_metadata().state_dict_metadata
    state = {k: torch.zeros(v.size, dtype=v.properties.dtype) if isinstance(v, _dcp.TensorStorageMetadata) else None
             for k, v in md.items()}
    _dcp.load(state, storage_reader=reader, no_dist=True)
    _dcp.save(state, storage_writer=distckpt.FileSystemWriter(out_dir), no_dist=True)
    print(f"resaved {len(state)} entries", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
