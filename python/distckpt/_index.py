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

import bisect
import heapq
import warnings

import numpy as np
import torch

from . import _dcp
from ._errors import CorruptionError
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


def pieces_of(chunk: ChunkRecord, size: int) -> List[Piece]:
    if chunk.flat is None:
        return [Piece(chunk.offset, chunk.length, chunk)]
    out = []
    for offset, length, first in flat_boxes(chunk.length, *chunk.flat):
        global_offset = tuple(a + b for a, b in zip(chunk.offset, offset))
        out.append(Piece(global_offset, length, chunk, (first - chunk.flat[0]) * size))
    return out


def check_tiling(key: str, shape, pieces: List[Piece]) -> None:
    """CorruptionError unless the stored PIECES of tensor KEY tile its SHAPE
    exactly once: counting elements alone would let an overlap hide a hole
    (the rules of the C++ reader, plan/coverage.cpp)."""
    boxes = [(tuple(p.offsets), tuple(p.sizes)) for p in pieces if all(n > 0 for n in p.sizes)]
    total = 1
    for n in shape:
        total *= n
    where = f"the stored chunks of '{key}' (global shape {list(shape)})"
    if total == 0:
        return
    if not shape:
        if len(boxes) != 1:
            raise CorruptionError(f"{where}: {len(boxes)} chunks hold its one element")
        return
    for off, size in boxes:
        if len(off) != len(shape) or any(o < 0 or o + n > e for o, n, e in zip(off, size, shape)):
            raise CorruptionError(f"{where}: a chunk at {list(off)} of {list(size)} lies outside it")
    cuts = [sorted({0, e} | {o[d] for o, _ in boxes} | {o[d] + n[d] for o, n in boxes})
            for d, e in enumerate(shape)]
    cells = 1
    for c in cuts:
        cells *= len(c) - 1
    if cells <= 8 * len(boxes) + 4096:  # every regular or aligned layout: mark the grid
        count = np.zeros([len(c) - 1 for c in cuts], dtype=np.int32)
        for off, size in boxes:
            count[tuple(slice(bisect.bisect_left(c, o), bisect.bisect_left(c, o + n))
                        for c, o, n in zip(cuts, off, size))] += 1
        if (count > 1).any():
            raise CorruptionError(f"{where}: two chunks overlap at "
                                  f"{[c[i] for c, i in zip(cuts, np.argwhere(count > 1)[0])]}")
        if (count == 0).any():
            raise CorruptionError(f"{where}: no chunk holds the elements at "
                                  f"{[c[i] for c, i in zip(cuts, np.argwhere(count == 0)[0])]}")
        return
    # A sweep over the first axis the boxes split: each box meets the open
    # boxes (whose range there reaches it) that can meet it on the next split
    # axis. With at most two split axes those are disjoint on the second, so
    # its neighbours there are the only candidates; with more, the work is
    # bounded (plan/coverage.cpp).
    split = [d for d, e in enumerate(shape) if any(o[d] != 0 or n[d] != e for o, n in boxes)]
    if not split:
        if len(boxes) != 1:
            raise CorruptionError(f"{where}: {len(boxes)} chunks each hold all of it")
        return
    a0, a1 = split[0], split[1] if len(split) > 1 else None
    boxes.sort()  # by a0 first: the axes before it are whole, offset 0 in every box
    for (a, _), (b, _) in zip(boxes, boxes[1:]):
        if a == b:
            raise CorruptionError(f"{where}: two chunks start at {list(a)}")
    size_of = dict(boxes)
    closing = []  # heap of (end on a0, open entry)
    open_boxes = []  # sorted (start on a1, end on a1, offsets)
    stored = comparisons = 0
    for off, size in boxes:
        while closing and closing[0][0] <= off[a0]:
            del open_boxes[bisect.bisect_left(open_boxes, heapq.heappop(closing)[1])]
        lo, hi = (off[a1], off[a1] + size[a1]) if a1 is not None else (0, 1)
        met = None
        if len(split) <= 2:
            i = bisect.bisect_right(open_boxes, (lo, float("inf")))
            if i < len(open_boxes) and open_boxes[i][0] < hi:
                met = open_boxes[i][2]
            elif i > 0 and open_boxes[i - 1][1] > lo:
                met = open_boxes[i - 1][2]
        else:
            for start, _, o in open_boxes:
                if start >= hi:
                    break
                comparisons += 1
                if comparisons > 1 << 24:
                    raise CorruptionError(f"{where}: {len(boxes)} chunks too irregular to check for overlaps")
                if all(a < c + m and c < a + k for a, k, c, m in zip(off, size, o, size_of[o])):
                    met = o
                    break
        if met is not None:
            raise CorruptionError(f"{where}: chunks at {list(met)} and {list(off)} overlap")
        entry = (lo, hi, off)
        bisect.insort(open_boxes, entry)
        heapq.heappush(closing, (off[a0] + size[a0], entry))
        stored += int(np.prod(size, dtype=object))
    if stored != total:
        raise CorruptionError(f"{where}: its chunks hold {stored} of its {total} elements")


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
        ps = [p for c in t.chunks for p in pieces_of(c, size)]
        check_tiling(t.key, t.shape, ps)
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
