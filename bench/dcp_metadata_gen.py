#!/usr/bin/env python3
"""Writes a PyTorch DCP checkpoint whose .metadata is large, as PyTorch
pickles it (DCP's own classes, pickle protocol 4 with its memo), for timing
how distckpt opens it (bench/dcp_metadata_scale.sh):

    python3 dcp_metadata_gen.py OUT_DIR TENSORS CHUNKS_PER_TENSOR

Tensor k is float32 [CHUNKS * 8, 64], stored as CHUNKS row chunks of 8 rows.
The items are not written: every chunk names bytes of one sparse file
__0_0.distcp of the right size (opening reads metadata only).
"""
import os
import pickle
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "interop"))
import torch  # noqa: E402

import dcp_common as dc  # noqa: E402

md = dc.dcp.metadata


def main(out, tensors, chunks):
    tensors, chunks = int(tensors), int(chunks)
    os.makedirs(out, exist_ok=True)
    item = 8 * 64 * 4 + 1024  # one chunk's archive, roughly
    state, storage = {}, {}
    offset = 0
    for k in range(tensors):
        key = f"model.layers.{k // 16}.block_{k % 16}.weight"
        parts = []
        for c in range(chunks):
            at = torch.Size([8 * c, 0])
            parts.append(md.ChunkStorageMetadata(offsets=at, sizes=torch.Size([8, 64])))
            storage[md.MetadataIndex(key, at, c)] = dc.dcp.filesystem._StorageInfo("__0_0.distcp", offset, item)
            offset += item
        state[key] = md.TensorStorageMetadata(
            properties=dc.st.TensorProperties(dtype=torch.float32), size=torch.Size([8 * chunks, 64]), chunks=parts)
    meta = md.Metadata(state_dict_metadata=state, planner_data=None, storage_data=storage)
    with open(os.path.join(out, ".metadata"), "wb") as f:
        pickle.dump(meta, f, protocol=4)
    with open(os.path.join(out, "__0_0.distcp"), "wb") as f:
        f.truncate(offset)
    print(f"{tensors * chunks} chunks, .metadata {os.path.getsize(os.path.join(out, '.metadata'))} bytes")


if __name__ == "__main__":
    main(*sys.argv[1:])
