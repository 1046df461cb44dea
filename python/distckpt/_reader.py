"""distckpt.FileSystemReader: a DCP StorageReader for the distckpt format."""
import io
import os

import torch

from . import _dcp, _index, _objects
from ._errors import CheckpointError
from ._format import COMMIT_FILE
from ._storage import Checkpoint

# Bytes read at once for one read item: a chunk larger than this is copied in
# windows of whole rows, so memory stays bounded whatever the tensor size.
WINDOW_BYTES = 64 << 20


def copy_region(ckpt: Checkpoint, piece: _index.Piece, itemsize: int, dtype: torch.dtype, offsets, lengths,
                dst: torch.Tensor, what: str) -> None:
    """dst <- the box (OFFSETS, LENGTHS) of PIECE (piece-relative)."""
    if piece.record is None:  # a tensor of the common state
        src = piece.common
        for axis, (o, n) in enumerate(zip(offsets, lengths)):
            src = src.narrow(axis, o, n)
        dst.copy_(src)
        return
    if all(n > 0 for n in lengths):
        _copy_rows(ckpt, piece.record, piece.byte_start, tuple(piece.sizes), tuple(offsets), tuple(lengths), itemsize,
                   dtype, dst, what)


def _copy_rows(ckpt, record, byte_start, sizes, offsets, lengths, itemsize, dtype, dst, what):
    """Copies in windows of whole rows (along the first axis) of at most
    WINDOW_BYTES; a row larger than that is copied row by row, one axis down,
    so only its wanted part is read."""
    if not sizes:  # a scalar
        dst.copy_(ckpt.read(record, byte_start, byte_start + itemsize, what).view(dtype).reshape(()))
        return
    row = itemsize
    for extent in sizes[1:]:
        row *= extent
    if row > WINDOW_BYTES:
        for i in range(lengths[0]):
            _copy_rows(ckpt, record, byte_start + (offsets[0] + i) * row, sizes[1:], offsets[1:], lengths[1:],
                       itemsize, dtype, dst.select(0, i), what)
        return
    rows_per_window = max(1, WINDOW_BYTES // max(row, 1))
    for done in range(0, lengths[0], rows_per_window):
        k = min(rows_per_window, lengths[0] - done)
        begin = byte_start + (offsets[0] + done) * row
        src = ckpt.read(record, begin, begin + k * row, what).view(dtype).reshape((k,) + sizes[1:])
        for axis in range(1, len(lengths)):
            src = src.narrow(axis, offsets[axis], lengths[axis])
        dst.narrow(0, done, k).copy_(src)


class FileSystemReader(_dcp.StorageReader):
    """Reads a distckpt checkpoint directory (written by the C++ runtime or by
    distckpt.FileSystemWriter) for torch.distributed.checkpoint: PyTorch's
    planner reshards into the caller's own sharded tensors. Every checksum
    block a read touches is verified; a mismatch raises CorruptionError naming
    the key, the file and the offset.

    Objects (sharded objects, and values common.fb cannot hold) are pickles,
    and a checkpoint is untrusted input: by default an object is rebuilt by a
    restricted unpickler that builds only what checkpoints hold (containers,
    numbers, argparse.Namespace, numpy arrays, RNG states, tensors, torch
    dtypes, torch.Size, ...; tensors inside objects load on the CPU) and
    raises UntrustedObjectError, naming the key and the global, for anything
    else, before any of it runs. TRUST_OBJECTS=True hands the stored bytes to
    DCP's planner as they are (DCP's default planner torch.loads them, which
    runs whatever the pickle names): only for checkpoints you trust."""

    def __init__(self, path, trust_objects: bool = False):
        super().__init__()
        self.path = os.fspath(path)
        self.trust_objects = bool(trust_objects)
        self._ckpt = None
        self._index = None

    # -- both versions --

    def read_metadata(self):
        return self._open().metadata

    def prepare_local_plan(self, plan):
        return plan

    def prepare_global_plan(self, plans):
        return plans

    def read_data(self, plan, planner):
        index = self._open()
        for item in plan.items:
            fqn = item.storage_index.fqn
            if item.type == _dcp.LoadItemType.BYTE_IO:
                planner.load_bytes(item, io.BytesIO(self._bytes_of(index, fqn)))
                continue
            piece = self._piece(index, item.storage_index)
            dst = planner.resolve_tensor(item).detach()
            copy_region(self._ckpt, piece, index.itemsize[fqn], index.dtypes[fqn], item.storage_offsets,
                        item.lengths, dst, f"tensor '{fqn}'")
            planner.commit_tensor(item, dst)
        return _dcp.done()

    # -- torch 1.13 --

    def init(self, metadata, is_coordinator):
        self._open()

    # -- torch 2.x --

    def set_up_storage_reader(self, metadata, is_coordinator, *args, **kwargs):
        self._open()

    def reset(self, checkpoint_id=None):
        self.close()
        if checkpoint_id is not None:
            self.path = os.fspath(checkpoint_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        try:
            return os.path.isfile(os.path.join(os.fspath(checkpoint_id), COMMIT_FILE))
        except TypeError:
            return False

    def storage_meta(self):
        return None

    # -- internals --

    def _open(self) -> _index.Index:
        if self._index is None:
            self._ckpt = Checkpoint(self.path)
            self._index = _index.build(self._ckpt)
        return self._index

    def close(self):
        if self._ckpt is not None:
            self._ckpt.close()
        self._ckpt = self._index = None

    @staticmethod
    def _piece(index, storage_index) -> _index.Piece:
        pieces = index.pieces.get(storage_index.fqn)
        if pieces is None:
            raise CheckpointError(f"'{storage_index.fqn}' is not a tensor of this checkpoint")
        hint = storage_index.index
        if hint is not None and 0 <= hint < len(pieces) and tuple(pieces[hint].offsets) == tuple(storage_index.offset):
            return pieces[hint]
        for p in pieces:
            if tuple(p.offsets) == tuple(storage_index.offset):
                return p
        raise CheckpointError(f"tensor '{storage_index.fqn}' has no stored chunk at offset "
                              f"{list(storage_index.offset)}")

    def _bytes_of(self, index, fqn) -> bytes:
        """What DCP's load_bytes gets for FQN: torch.save bytes of the value.
        Those of an object are made here from what the restricted unpickler
        rebuilt (unless trust_objects), so a planner's torch.load only ever
        sees allow-listed parts."""
        if fqn in index.objects:
            o = index.objects[fqn]
            raw = bytes(self._ckpt.read(o, 0, o.byte_length, f"object '{o.unique_key}'").numpy())
            if not raw.startswith(_objects.TORCH_ARCHIVE):
                value = raw  # bytes a C++ program stored: given back as bytes
            elif self.trust_objects:
                return raw  # written by torch.save (the Python writer, torch::pickle_save): the object itself
            else:
                value = _objects.decode(raw, fqn, self.path, o.unique_key)
        elif fqn in index.values:
            value = index.values[fqn]
        else:
            raise CheckpointError(f"'{fqn}' is not a value of this checkpoint")
        out = io.BytesIO()
        torch.save(value, out)
        return out.getvalue()
