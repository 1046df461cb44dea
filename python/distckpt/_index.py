"""What a distckpt checkpoint looks like to DCP: the entries of its Metadata
and, for each, where the bytes are.

- Sharded tensors: one DCP chunk per stored box. A ZeRO chunk (a flat slice
  of a box's row-major flattening) is not a box; it is exposed as the at most
  2*rank-1 boxes whose elements it stores contiguously, so PyTorch's planner
  resolves overlaps with its own geometry.
- Common values: every node of the common tree, under its dotted path
  ("optimizer.param_groups.0.lr", "optimizer" for the whole subtree) as DCP
  2.x flattens nested state dicts. Tensors are tensor entries with one chunk,
  everything else a bytes entry (torch.load gives the value back).
- Sharded objects: bytes entries under Megatron's unique key
  (KEY/shard_OFFSET_SHAPE), and under KEY alone for an object of one shard.
Names taken by a sharded tensor are never shadowed by a common path.
"""
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import warnings

import torch

from . import _dcp
from ._format import DTYPES, ChunkRecord, ObjectRecord, dtype_of, itemsize


@dataclass
class Piece:
    """A DCP chunk: a box of the tensor stored contiguously (row-major)."""
    offsets: Tuple[int, ...]
    sizes: Tuple[int, ...]
    record: Optional[ChunkRecord]  # None: a tensor of the common state
    byte_start: int = 0  # of the box's first element, relative to the record's bytes
    common: Optional[torch.Tensor] = None


@dataclass
class Index:
    metadata: "_dcp.Metadata"
    pieces: Dict[str, List[Piece]]
    itemsize: Dict[str, int]
    dtypes: Dict[str, torch.dtype]
    objects: Dict[str, ObjectRecord]
    values: Dict[str, object]  # bytes entries of the common state


def flat_boxes(lengths, start, stop):
    """The boxes (offset, length, first flat index) that tile the flat range
    [START, STOP) of a row-major box of LENGTHS, each contiguous."""
    if start >= stop:
        return []
    if not lengths:
        return [((), (), 0)]
    inner = 1
    for extent in lengths[1:]:
        inner *= extent
    rest = tuple(0 for _ in lengths[1:])
    r0, c0 = divmod(start, inner)
    r1, c1 = divmod(stop, inner)
    out = []

    def in_row(row, a, b):
        return [((row,) + o, (1,) + n, row * inner + f) for o, n, f in flat_boxes(lengths[1:], a, b)]

    if r0 == r1:
        return in_row(r0, c0, c1)
    if c0:
        out += in_row(r0, c0, inner)
        r0 += 1
    if r1 > r0:
        out.append(((r0,) + rest, (r1 - r0,) + tuple(lengths[1:]), r0 * inner))
    if c1:
        out += in_row(r1, 0, c1)
    return out


def _pieces(chunk: ChunkRecord, size: int) -> List[Piece]:
    if chunk.flat is None:
        return [Piece(chunk.offset, chunk.length, chunk)]
    out = []
    for offset, length, first in flat_boxes(chunk.length, *chunk.flat):
        global_offset = tuple(a + b for a, b in zip(chunk.offset, offset))
        out.append(Piece(global_offset, length, chunk, (first - chunk.flat[0]) * size))
    return out


def _walk(value, path, out):
    """Every node of the common tree under its dotted path."""
    if path:
        out[".".join(path)] = value
    if isinstance(value, dict):
        for k, v in value.items():
            _walk(v, path + [k], out)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _walk(v, path + [str(i)], out)


def build(ckpt) -> Index:
    m = ckpt.metadata
    md, pieces, sizes, dtypes = {}, {}, {}, {}
    skipped = []
    for t in m.tensors:
        if t.dtype not in DTYPES:  # a dtype this torch lacks: listed by inspect, not loadable
            skipped.append(t.key)
            continue
        dtype = dtype_of(t.dtype)
        size = itemsize(dtype)
        ps = [p for c in t.chunks for p in _pieces(c, size)]
        md[t.key] = _dcp.TensorStorageMetadata(
            properties=_dcp.tensor_properties(dtype), size=torch.Size(t.shape),
            chunks=[_dcp.ChunkStorageMetadata(offsets=torch.Size(p.offsets), sizes=torch.Size(p.sizes)) for p in ps])
        pieces[t.key], sizes[t.key], dtypes[t.key] = ps, size, dtype
    reserved = set(skipped)  # their names stay theirs, loadable or not
    objects = {}
    for o in m.objects:
        names = [o.unique_key] + ([o.key] if all(n == 1 for n in o.global_shape) else [])
        for name in names:
            if name not in md and name not in reserved:
                objects[name] = o
                md[name] = _dcp.BytesStorageMetadata()
    nodes, values = {}, {}
    _walk(ckpt.common_state(), [], nodes)
    for name, value in nodes.items():
        if name in md or name in reserved:
            continue
        if isinstance(value, torch.Tensor):
            shape = tuple(value.shape)
            md[name] = _dcp.TensorStorageMetadata(
                properties=_dcp.tensor_properties(value.dtype), size=value.shape,
                chunks=[_dcp.ChunkStorageMetadata(offsets=torch.Size([0] * len(shape)), sizes=value.shape)])
            pieces[name] = [Piece(tuple([0] * len(shape)), shape, None, common=value)]
            sizes[name], dtypes[name] = value.element_size(), value.dtype
        else:
            md[name] = _dcp.BytesStorageMetadata()
            values[name] = value
    if skipped:
        more = f" and {len(skipped) - 20} more" if len(skipped) > 20 else ""
        warnings.warn(f"{ckpt.path}: {', '.join(repr(k) for k in skipped[:20])}{more} left out: their dtypes have "
                      "no type in this torch (distckpt.inspect lists them)", stacklevel=3)
    return Index(_dcp.Metadata(state_dict_metadata=md), pieces, sizes, dtypes, objects, values)
