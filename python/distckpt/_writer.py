"""distckpt.FileSystemWriter: a DCP StorageWriter that writes the distckpt
format, so a PyTorch job saves checkpoints the C++ runtime loads under any
layout.

Every rank writes one data file (data/rank_NNNNN.bin) into the staging
directory the C++ runtime uses (.NAME.distckpt-staging), with an XXH3 per
block of each item, and fsyncs it. The coordinator then writes common.fb
(values torch.save would pickle, where they are plain data: told apart by
the restricted unpickler of _objects.py, never by torch.load), metadata.fb and,
last, metadata.json, and renames the staging directory into place: a save
that fails anywhere leaves the previous checkpoint as it was.
"""
import contextlib
import dataclasses
import io
import os
import shutil
from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np
import torch

from . import _common, _dcp, _objects
from ._errors import CheckpointError, Error, UsageError, from_os_error
from ._format import (COMMIT_FILE, COMMON_FILE, DEFAULT_BLOCK_SIZE, MAX_BLOCK_SIZE, METADATA_FILE, ChunkRecord,
                      FileRecord, Metadata, ObjectRecord, RecordedFile, TensorRecord, block_checksums,
                      commit_marker_text, encode_metadata, fsync_dir, load_commit_marker, name_of, write_all,
                      write_file_atomic, xxh3)
from ._paths import claim_staging, staging_paths

__version__ = "0.1.0"


@dataclass(frozen=True)
class _RankFile:
    rank: int


@dataclass(frozen=True)
class _Stored:
    """Where one item went: a tensor chunk or a pickled object."""
    rank: int
    byte_offset: int
    byte_length: int
    checksums: Tuple[int, ...]
    offsets: Tuple[int, ...] = ()
    sizes: Tuple[int, ...] = ()
    dtype: str = ""
    shape: Tuple[int, ...] = ()
    is_object: bool = False


@dataclass(frozen=True)
class _Value:
    """A value for common.fb, carried to the coordinator."""
    value: object


_NOT_PLAIN = object()


def _plain_value(raw: bytes, fqn: str):
    """The value DCP pickled into RAW when it is plain data common.fb holds
    (None, bool, int64, float, str, tensors, dicts with string keys, lists,
    tuples), else _NOT_PLAIN: the bytes are then stored as they are, as an
    object. RAW is read by the restricted unpickler, never by torch.load: a
    save runs no code of the values it stores (a __reduce__ naming anything
    off the allow-list is refused there and kept as an object)."""
    if not raw.startswith(_objects.TORCH_ARCHIVE):
        return _NOT_PLAIN  # a planner's own bytes
    try:
        value = _objects.decode(raw, fqn, "save")
    except Error:
        return _NOT_PLAIN
    return value if _common.representable(value) else _NOT_PLAIN


def rank_file(rank: int) -> str:
    return f"data/rank_{rank:05d}.bin"


class FileSystemWriter(_dcp.StorageWriter):
    """Saves a state dict with torch.distributed.checkpoint into PATH as a
    distckpt checkpoint. An existing checkpoint is refused unless
    OVERWRITE, and then replaced only once the new one is committed."""

    def __init__(self, path, overwrite: bool = False, block_size: int = DEFAULT_BLOCK_SIZE,
                 content_metadata: Optional[dict] = None):
        super().__init__()
        if not 0 < block_size <= MAX_BLOCK_SIZE:
            raise UsageError(f"block_size must be positive and at most {MAX_BLOCK_SIZE} (1 GiB; a reader holds a "
                             f"block in memory to check it), not {block_size}")
        if content_metadata is not None and not isinstance(content_metadata, dict):
            raise UsageError(f"content_metadata must be a dict, not a {type(content_metadata).__name__}")
        self.content_metadata = content_metadata
        self.path = os.fspath(path)
        self.overwrite = overwrite
        self.block_size = block_size
        self._lock = None  # the staging lock, held on the coordinator from _claim to finish
        self._busy = 0  # write_data or finish running (another save of the target must not take the lock)

    # -- both versions --

    def prepare_local_plan(self, plan):
        return plan

    def prepare_global_plan(self, plans):
        """Coordinator only, before any rank writes: claim the directory."""
        self._claim()
        return [dataclasses.replace(p, storage_data=_RankFile(i)) for i, p in enumerate(plans)]

    @property
    def active(self) -> bool:
        return self._busy > 0

    @contextlib.contextmanager
    def _in_use(self):
        self._busy += 1
        try:
            yield
        finally:
            self._busy -= 1

    def write_data(self, plan, planner):
        with self._in_use():
            try:
                return self._write_data(plan, planner)
            except BaseException:
                self._release()  # this save failed: the next one need not take its lock over
                raise

    def _write_data(self, plan, planner):
        rank = plan.storage_data.rank
        _, _, staging, _ = staging_paths(self.path)
        path = os.path.join(staging, rank_file(rank))
        try:
            return self._write_rank_file(plan, planner, rank, path)
        except OSError as e:
            if isinstance(e, Error):
                raise
            raise from_os_error(e, "write of", path) from None

    def _write_rank_file(self, plan, planner, rank, path):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        results, offset = [], 0
        try:
            for item in plan.items:
                data = planner.resolve_data(item)
                if item.type == _dcp.WriteItemType.BYTE_IO:
                    raw = data.getvalue() if isinstance(data, io.BytesIO) else bytes(data)
                    value = _plain_value(raw, item.index.fqn)
                    if value is not _NOT_PLAIN:
                        results.append(_dcp.WriteResult(index=item.index, size_in_bytes=len(raw),
                                                        storage_data=_Value(value)))
                        continue
                    view, stored = memoryview(raw), {"is_object": True}
                else:
                    t = data.detach()
                    if t.device.type != "cpu":
                        t = t.cpu()
                    t = t.contiguous()
                    name_of(t.dtype)  # refuses a dtype the format cannot store
                    view = memoryview(t.reshape(-1).view(torch.uint8).numpy()) if t.numel() else memoryview(b"")
                    chunk = item.tensor_data.chunk
                    stored = {"offsets": tuple(chunk.offsets), "sizes": tuple(chunk.sizes),
                              "dtype": name_of(item.tensor_data.properties.dtype),
                              "shape": tuple(item.tensor_data.size)}
                write_all(fd, view)
                sums = tuple(block_checksums(view, self.block_size))
                results.append(_dcp.WriteResult(index=item.index, size_in_bytes=len(view),
                                                storage_data=_Stored(rank, offset, len(view), sums, **stored)))
                offset += len(view)
            os.fsync(fd)
        finally:
            os.close(fd)
        return _dcp.done(results)

    def finish(self, metadata, results):
        with self._in_use():
            try:
                self._finish(results)
            finally:
                self._release()

    def _finish(self, results):
        target, parent, staging, old = staging_paths(self.path)
        world = len(results)
        tensors, objects, common = {}, [], {}
        sizes = [0] * world
        for rank_results in results:
            for r in rank_results:
                fqn, s = r.index.fqn, r.storage_data
                if isinstance(s, _Value):
                    common[fqn] = s.value
                    continue
                sizes[s.rank] = max(sizes[s.rank], s.byte_offset + s.byte_length)
                sums = np.asarray(s.checksums, dtype=np.uint64)
                if s.is_object:
                    objects.append(ObjectRecord(fqn, (1,), (0,), s.rank, s.byte_offset, s.byte_length, sums))
                    continue
                t = tensors.setdefault(fqn, TensorRecord(fqn, s.dtype, s.shape))
                t.chunks.append(ChunkRecord(s.offsets, s.sizes, None, s.rank, s.byte_offset, s.byte_length, sums))
        for rank in range(world):
            actual = os.stat(os.path.join(staging, rank_file(rank))).st_size
            if actual != sizes[rank]:
                raise CheckpointError(f"{os.path.join(staging, rank_file(rank))} has {actual} bytes, but rank {rank} "
                                      f"reported {sizes[rank]}: is {staging} on a file system every rank shares?")
        files = [FileRecord(rank_file(r), sizes[r], r) for r in range(world)]
        m = Metadata(world_size=world, block_size=self.block_size, tensors=list(tensors.values()), objects=objects,
                     files=files, common_file=COMMON_FILE)
        common_bytes, metadata_bytes = _common.encode(common, self.content_metadata), encode_metadata(m)
        write_file_atomic(os.path.join(staging, COMMON_FILE), common_bytes)
        write_file_atomic(os.path.join(staging, METADATA_FILE), metadata_bytes)
        fsync_dir(os.path.join(staging, "data"))
        marker = commit_marker_text(world, RecordedFile(METADATA_FILE, len(metadata_bytes), xxh3(metadata_bytes)),
                                    RecordedFile(COMMON_FILE, len(common_bytes), xxh3(common_bytes)),
                                    f"distckpt-python {__version__} (torch {torch.__version__})")
        write_file_atomic(os.path.join(staging, COMMIT_FILE), marker)
        self._commit(target, parent, staging, old)

    # -- torch 1.13 --

    def init(self, is_coordinator):
        pass

    # -- torch 2.x --

    def set_up_storage_writer(self, is_coordinator, *args, **kwargs):
        pass

    def reset(self, checkpoint_id=None):
        if checkpoint_id is not None:
            self.path = os.fspath(checkpoint_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        try:
            os.fspath(checkpoint_id)
            return True
        except TypeError:
            return False

    def storage_meta(self):
        return _dcp.storage_meta(self.path)

    # -- the directory --

    def _claim(self):
        """The rules of the C++ runtime's save (api/save_commit.cpp), under
        its lock: held until finish() commits (or this writer is dropped)."""
        target, parent, staging, old = staging_paths(self.path)
        self._release()
        os.makedirs(parent, exist_ok=True)  # a save may name a directory whose parent is still to come
        self._lock = claim_staging(target, self)
        try:
            self._check_and_prepare(target, staging, old)
        except BaseException:
            self._release()
            raise

    def _check_and_prepare(self, target, staging, old):
        committed = os.path.isfile(os.path.join(target, COMMIT_FILE))
        if committed:
            load_commit_marker(target)  # a damaged marker is reported, never taken for "nothing here"
            if not self.overwrite:
                raise CheckpointError(f"'{target}' already holds a committed checkpoint; pass overwrite=True to "
                                      "replace it (the old one is removed only after the new one is committed) or "
                                      "save into another directory")
        elif os.path.exists(target) and not os.path.isdir(target):
            raise CheckpointError(f"'{target}' is a file; a checkpoint is a directory: choose another path")
        elif os.path.exists(target) and os.listdir(target):
            raise CheckpointError(f"'{target}' exists, is not empty and holds no committed distckpt checkpoint; "
                                  "remove it or choose another directory")
        if os.path.exists(old):
            if not committed:
                raise CheckpointError(f"found '{old}' left by an interrupted overwrite of '{target}': it holds the "
                                      f"previous checkpoint. Rename it back to '{target}' (or delete it) before saving "
                                      "again")
            shutil.rmtree(old)
        shutil.rmtree(staging, ignore_errors=True)  # left by a save that died: never committed
        os.makedirs(os.path.join(staging, "data"))

    def _release(self):
        lock, self._lock = self._lock, None
        if lock is not None and lock.owner() is self:  # not taken over by a later save
            lock.release()

    def _commit(self, target, parent, staging, old):
        replacing = os.path.isfile(os.path.join(target, COMMIT_FILE))
        if replacing and not self.overwrite:  # committed by someone else since _claim
            raise CheckpointError(f"'{target}' was committed by another save while this one ran; pass "
                                  "overwrite=True to replace it")
        if replacing:
            os.rename(target, old)  # a crash from here on leaves the previous checkpoint in OLD, and says so
        elif os.path.isdir(target):
            os.rmdir(target)  # empty, checked by _claim
        try:
            os.rename(staging, target)
            fsync_dir(parent)
        except BaseException:
            if replacing and not os.path.exists(target):
                os.rename(old, target)
            raise
        if replacing:
            shutil.rmtree(old, ignore_errors=True)
