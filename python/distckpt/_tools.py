"""Helpers for scripts: what a checkpoint holds, whether it is intact, and
its tensors as plain (unsharded) torch tensors."""
import os
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional

import torch

from . import _index
from ._errors import CheckpointError, CorruptionError
from ._format import COMMIT_FILE, COMMON_FILE, METADATA_FILE, dtype_of, itemsize, numel, unrepresentable_reason
from ._reader import copy_region
from ._storage import Checkpoint


def inspect(path) -> dict:
    """The checkpoint's commit marker, tensors (dtype, shape, chunk count),
    object keys and common-state keys, as plain Python data."""
    with Checkpoint(path) as ckpt:
        m = ckpt.metadata
        return {
            "format_version": ckpt.marker.version,
            "world_size": m.world_size,
            "created_by": ckpt.marker.created_by,
            "layout": m.layout_name,
            "tensors": {t.key: {"dtype": t.dtype, "shape": list(t.shape), "chunks": len(t.chunks)}
                        for t in m.tensors},
            "objects": [o.unique_key for o in m.objects],
            "common": sorted(ckpt.common_state()),
        }


def load_content_metadata(path) -> Optional[dict]:
    """The small dict a save stored with the checkpoint (C++
    SaveOptions::content_metadata, FileSystemWriter(content_metadata=...));
    None when it has none. Reads the marker, metadata and common file only."""
    with Checkpoint(path) as ckpt:
        return ckpt.content_metadata()


@dataclass
class VerifyReport:
    problems: List[str] = field(default_factory=list)
    bytes_checked: int = 0
    not_a_checkpoint: bool = False  # no committed checkpoint, or an unknown format or version

    @property
    def intact(self) -> bool:
        return not self.problems

    @property
    def status(self) -> str:
        """"intact", "corrupt" or "not_a_checkpoint", as `distckpt verify --json` says."""
        return "not_a_checkpoint" if self.not_a_checkpoint else ("intact" if self.intact else "corrupt")


def verify(path) -> VerifyReport:
    """Re-reads every stored byte against its checksum and checks that each
    tensor's chunks hold as many elements as the tensor has. Problems are
    collected, not raised, so one run lists every damaged range; a checkpoint
    whose marker or metadata cannot be read is reported as one problem."""
    report = VerifyReport()
    try:
        ckpt = Checkpoint(path)
    except CheckpointError as e:
        report.problems.append(str(e))
        # The files of a save that never committed are a damaged checkpoint, as in C++.
        uncommitted = any(os.path.lexists(os.path.join(os.fspath(path), name))
                          for name in (METADATA_FILE, COMMON_FILE, "data"))
        report.not_a_checkpoint = not isinstance(e, CorruptionError) and not (
            uncommitted and not os.path.lexists(os.path.join(os.fspath(path), COMMIT_FILE)))
        return report
    with ckpt:
        try:
            ckpt.common_state()
        except CheckpointError as e:
            report.problems.append(str(e))
        # Whole checksum blocks per read: a step inside a block would read it again for every step.
        block = ckpt.metadata.block_size
        step = max(64 << 20, block) // max(block, 1) * max(block, 1)
        records = [(f"tensor '{t.key}' chunk {i}", c) for t in ckpt.metadata.tensors for i, c in enumerate(t.chunks)]
        records += [(f"object '{o.unique_key}'", o) for o in ckpt.metadata.objects]
        for what, record in records:
            for begin in range(0, record.byte_length, step):
                try:
                    ckpt.read(record, begin, min(begin + step, record.byte_length), what)
                except (CheckpointError, OSError) as e:
                    report.problems.append(str(e))
        for t in ckpt.metadata.tensors:
            try:
                _index.check_tiling(t.key, t.shape, [p for c in t.chunks for p in _index.pieces_of(c, 1)])
            except CorruptionError as e:
                report.problems.append(str(e))
        report.bytes_checked = ckpt.bytes_read
    return report


def load_plain_tensors(path, keys: Optional[Iterable[str]] = None) -> Dict[str, torch.Tensor]:
    """Tensors of the checkpoint (all, or KEYS) as whole CPU tensors, read
    without a process group. Common-state tensors are not included."""
    with Checkpoint(path) as ckpt:
        records = {t.key: t for t in ckpt.metadata.tensors}
        wanted = list(records) if keys is None else list(keys)
        missing = [k for k in wanted if k not in records]
        if missing:
            raise CheckpointError(f"{path} has no tensor {', '.join(repr(k) for k in missing[:5])}"
                                  f"{' ...' if len(missing) > 5 else ''}; `distckpt.inspect` lists the keys")
        out = {}
        for key in wanted:
            t = records[key]
            reason = unrepresentable_reason(t.dtype)
            if reason:
                raise CheckpointError(f"'{key}' in {path} cannot be loaded: {reason}; pass keys= to read the others")
            dtype = dtype_of(t.dtype)
            size = itemsize(dtype)
            if t.stored_numel() != numel(t.shape):  # before allocating: a damaged shape must not exhaust memory
                raise CorruptionError(f"{os.path.join(os.fspath(path), 'metadata.fb')}: the chunks of tensor '{key}' "
                                      f"store {t.stored_numel()} of its {numel(t.shape)} elements")
            pieces = [p for c in t.chunks for p in _index.pieces_of(c, size)]
            _index.check_tiling(key, t.shape, pieces)  # every element written below exactly once
            dst = torch.empty(t.shape, dtype=dtype)
            for piece in pieces:
                view = dst
                for axis, (o, n) in enumerate(zip(piece.offsets, piece.sizes)):
                    view = view.narrow(axis, o, n)
                copy_region(ckpt, piece, size, dtype, [0] * len(piece.sizes), piece.sizes, view, f"tensor '{key}'")
            out[key] = dst
        return out
