"""distckpt's on-disk format (schema/checkpoint.fbs) read and written in
Python, with the checks the C++ runtime makes (format/metadata.cpp,
format/commit.cpp): every record is checked against the buffer and the files
before anything trusts it.

A checkpoint directory holds
    metadata.json   the commit marker, written last: format, version, world
                    size, and the size and XXH3 of metadata.fb and common.fb
                    (from version 3 also the XXH3 of metadata.fb's head)
    metadata.fb     tensors (chunks with byte ranges and per-block XXH3),
                    objects, files
    common.fb       the common (non-sharded) state
    data/rank_NNNNN.bin  one data file per rank
"""
import json
import os
import stat
import struct
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import flatbuffers
import numpy as np
import torch
import xxhash

from ._errors import CheckpointError, CorruptionError, UsageError, from_os_error
from ._paths import check_opened, inside, validate_relative

try:
    from .fb import (ChunkRecord as _Chunk, CheckpointMetadata as _Meta, FileRecord as _File,
                     ObjectRecord as _Object, TensorRecord as _Tensor)
except ImportError as e:  # pragma: no cover - a packaging mistake, not a user error
    raise ImportError("distckpt's FlatBuffers bindings (distckpt.fb) are missing: they are generated from "
                      "schema/checkpoint.fbs when the package is built; install it with `pip install ./python` "
                      "or use the build tree's python/ directory") from e

FORMAT_NAME = "distckpt"
# Versions 1..READ_VERSION are read; WRITE_VERSION is written (version 3 adds
# fields the writer has no use for, and a version 2 checkpoint is read by
# every distckpt that reads version 3).
READ_VERSION = 3
WRITE_VERSION = 2
OLDEST_VERSION = 1
_HEAD_VERSION = 3  # the first version whose marker records the head of metadata.fb
MAX_BLOCK_SIZE = 1 << 30  # StorageIndex::kMaxChecksumBlockSize: a reader holds a block to check it
BACKEND = "distckpt-fb"
COMMIT_FILE = "metadata.json"
METADATA_FILE = "metadata.fb"
COMMON_FILE = "common.fb"
DEFAULT_BLOCK_SIZE = 1 << 20
_MAX_COMMIT_BYTES = 1 << 20
_MAX_BUFFER = (1 << 31) - 1  # FlatBuffers' own limit

# The dtype names written to disk (format/dtype.cpp): never renamed, only
# added. Each with its element size; its torch type where this torch has one
# (float8 since 2.1, uint16/32/64 since 2.3).
ELEMENT_SIZES = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int16": 2, "int8": 1,
    "uint8": 1, "bool": 1, "complex64": 8, "complex128": 16, "uint16": 2, "uint32": 4, "uint64": 8,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1, "float8_e8m0fnu": 1,
}
DTYPES = {name: getattr(torch, name) for name in ELEMENT_SIZES if isinstance(getattr(torch, name, None), torch.dtype)}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


def dtype_of(name: str) -> torch.dtype:
    """The torch dtype of a stored name: CorruptionError for a name this
    version does not know, CheckpointError for one this torch lacks."""
    try:
        return DTYPES[name]
    except KeyError:
        if name in ELEMENT_SIZES:
            raise CheckpointError(unrepresentable_reason(name)) from None
        raise CorruptionError(f"unknown dtype '{name}' (known: {', '.join(ELEMENT_SIZES)}); the checkpoint is "
                              "corrupted or was written by a newer distckpt") from None


def unrepresentable_reason(name: str) -> str:
    """Why a stored dtype name has no torch type here ('' when it has one)."""
    if name in DTYPES:
        return ""
    if name in ELEMENT_SIZES:
        return f"this torch has no {name} type (a newer torch has)"
    return f"{name} is a dtype this version of distckpt does not know (a newer one wrote it)"


def element_size_of(name: str, recorded: int) -> int:
    """Bytes per element of a stored dtype name: known names must match what
    the metadata recorded (0: not recorded); unknown ones take it."""
    known = ELEMENT_SIZES.get(name)
    if known is None:
        if recorded not in (1, 2, 4, 8, 16):
            what = "no element size recorded" if recorded == 0 else f"element size {recorded}"
            raise CorruptionError(f"unknown dtype '{name}' with {what} (known: {', '.join(ELEMENT_SIZES)}); the "
                                  "checkpoint is corrupted")
        return recorded
    if recorded not in (0, known):
        raise CorruptionError(f"dtype {name} is recorded with element size {recorded}, but its elements take "
                              f"{known} bytes")
    return known


def name_of(dtype: torch.dtype) -> str:
    try:
        return DTYPE_NAMES[dtype]
    except KeyError:
        raise UsageError(f"dtype {dtype} cannot be stored in a distckpt checkpoint (supported: "
                              f"{', '.join(DTYPES)}); convert the tensor first") from None


def xxh3(data) -> int:
    return xxhash.xxh3_64_intdigest(data)


def block_checksums(data: memoryview, block: int) -> List[int]:
    return [xxh3(data[i:i + block]) for i in range(0, len(data), block)]


# --- records -------------------------------------------------------------

@dataclass
class FileRecord:
    path: str
    size: int
    writer_rank: int


@dataclass
class ChunkRecord:
    offset: Tuple[int, ...]
    length: Tuple[int, ...]
    flat: Optional[Tuple[int, int]]  # the stored half-open slice of the box's flattening (ZeRO)
    file: int
    byte_offset: int
    byte_length: int
    checksums: np.ndarray  # uint64, one per block of the chunk's bytes

    def stored_numel(self) -> int:
        return self.flat[1] - self.flat[0] if self.flat else numel(self.length)


@dataclass
class TensorRecord:
    key: str
    dtype: str  # the stored name, which this torch may have no type for (dtype_of raises then)
    shape: Tuple[int, ...]
    chunks: List[ChunkRecord] = field(default_factory=list)
    element_size: int = 0

    def stored_numel(self) -> int:
        """Elements its chunks store: the tensor's own count when they tile it."""
        return sum(c.stored_numel() for c in self.chunks)


@dataclass
class ObjectRecord:
    key: str
    global_shape: Tuple[int, ...]
    global_offset: Tuple[int, ...]
    file: int
    byte_offset: int
    byte_length: int
    checksums: np.ndarray

    @property
    def unique_key(self) -> str:
        """As Megatron-Core's ShardedObject.unique_key (and the C++ runtime's)."""
        return (f"{self.key}/shard_{'.'.join(map(str, self.global_offset))}_"
                f"{'.'.join(map(str, self.global_shape))}")


@dataclass
class Metadata:
    world_size: int
    block_size: int  # 0: no checksums recorded
    tensors: List[TensorRecord]
    objects: List[ObjectRecord]
    files: List[FileRecord]
    common_file: str = ""
    format_version: int = WRITE_VERSION
    layout_name: str = ""


@dataclass
class RecordedFile:
    path: str
    size: int
    xxh3: int
    # The XXH3 of the first head_size bytes: metadata.fb from version 3 on
    # (None before, and for common.fb).
    head_size: Optional[int] = None
    head_xxh3: Optional[int] = None


@dataclass
class CommitMarker:
    version: int
    world_size: int
    created_by: str
    metadata: Optional[RecordedFile]  # None only in version 1
    common: Optional[RecordedFile]


def numel(shape) -> int:
    n = 1
    for extent in shape:
        n *= extent
    return n


def itemsize(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


# --- the commit marker ---------------------------------------------------

def parse_commit_marker(text: bytes, origin: str) -> CommitMarker:
    def reject(what):
        raise CorruptionError(f"{origin}: {what}")

    if len(text) > _MAX_COMMIT_BYTES:
        reject(f"{len(text)} bytes, more than a commit marker can be; the file is not ours")
    try:
        doc = json.loads(text)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        reject(f"malformed JSON ({type(e).__name__}: {e}); the commit marker is damaged")
    if not isinstance(doc, dict):
        reject("expected a JSON object; the commit marker is damaged")
    if doc.get("format") != FORMAT_NAME:
        writer = next((doc[k] for k in ("format", "sharded_backend") if isinstance(doc.get(k), str)),
                      "an unknown program")
        raise CheckpointError(f"{origin}: was written by '{writer}', not distckpt; load it with the tool that wrote it")

    def field_of(doc, name, kind, where):
        if name not in doc:
            reject(f"{where}field \"{name}\" is missing; the commit marker is damaged")
        value = doc[name]
        if kind is int and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            reject(f"{where}field \"{name}\" is not a non-negative integer; the commit marker is damaged")
        if kind is str and not isinstance(value, str):
            reject(f"{where}field \"{name}\" is not a string; the commit marker is damaged")
        return value

    version = field_of(doc, "version", int, "")
    if version > READ_VERSION:
        raise CheckpointError(f"{origin}: checkpoint format version {version} is newer than this distckpt reads "
                              f"(version {READ_VERSION}); upgrade distckpt to load it")
    if version < OLDEST_VERSION:
        reject(f"format version {version} is not valid")
    for name in ("sharded_backend", "common_backend"):
        field_of(doc, name, str, "")
    world_size = field_of(doc, "world_size", int, "")
    if world_size < 1:
        reject(f"world_size {world_size} is not valid")
    if version == 1:
        return CommitMarker(1, world_size, str(doc.get("created_by", "")), None, None)
    known = {"format", "version", "sharded_backend", "common_backend", "world_size", "created_by", "metadata",
             "common"}
    for name in doc:
        if name not in known:
            reject(f"unknown field \"{name}\"; the commit marker is damaged or was edited")
    if doc["sharded_backend"] != BACKEND or doc["common_backend"] != BACKEND:
        reject(f"unknown backend '{doc['sharded_backend']}'/'{doc['common_backend']}' (this reads '{BACKEND}')")

    def recorded(name, head):
        entry = doc.get(name)
        if not isinstance(entry, dict):
            reject(f"field \"{name}\" is missing or not an object")
        where = f"field \"{name}\": "
        known = ("file", "bytes", "xxh3") + (("head_bytes", "head_xxh3") if head else ())
        for key in entry:
            if key not in known:
                reject(f"{where}unknown field \"{key}\"; the commit marker is damaged or was edited")
        path = field_of(entry, "file", str, where)
        try:
            validate_relative(path)
        except CorruptionError as e:
            reject(f"{where}{e}")

        def hex64(key):
            digest = field_of(entry, key, str, where)
            if len(digest) != 16 or any(c not in "0123456789abcdef" for c in digest):
                reject(f"{name}: \"{key}\" must be 16 lowercase hex digits, not \"{digest}\"")
            return int(digest, 16)

        record = RecordedFile(path, field_of(entry, "bytes", int, where), hex64("xxh3"))
        if head:
            record.head_size, record.head_xxh3 = field_of(entry, "head_bytes", int, where), hex64("head_xxh3")
            if record.head_size > record.size:
                reject(f"{where}\"head_bytes\" {record.head_size} is more than \"bytes\" {record.size}; the "
                       "commit marker is damaged")
        return record

    return CommitMarker(version, world_size, field_of(doc, "created_by", str, ""),
                        recorded("metadata", version >= _HEAD_VERSION), recorded("common", False))


def commit_marker_text(world_size: int, metadata: RecordedFile, common: RecordedFile, created_by: str) -> bytes:
    """A marker of WRITE_VERSION: it records no head (a version 2 marker
    must not)."""
    doc = {
        "format": FORMAT_NAME, "version": WRITE_VERSION, "sharded_backend": BACKEND, "common_backend": BACKEND,
        "world_size": world_size, "created_by": created_by,
        "metadata": {"file": metadata.path, "bytes": metadata.size, "xxh3": f"{metadata.xxh3:016x}"},
        "common": {"file": common.path, "bytes": common.size, "xxh3": f"{common.xxh3:016x}"},
    }
    return (json.dumps(doc, indent=2) + "\n").encode()


def check_recorded(record: RecordedFile, data: bytes, full_path: str) -> None:
    if len(data) != record.size:
        raise CorruptionError(f"{full_path} has {len(data)} bytes but the commit marker ({COMMIT_FILE}) records "
                              f"{record.size}: the file was truncated or replaced; the checkpoint is corrupt, load an "
                              "intact copy")
    actual = xxh3(data)
    if actual != record.xxh3:
        raise CorruptionError(f"checksum mismatch in {full_path}: XXH3 {actual:016x} but the commit marker "
                              f"({COMMIT_FILE}) records {record.xxh3:016x}; the checkpoint is corrupt, run "
                              "`distckpt verify` and load an intact copy")
    # A reader that trusts the head alone must get the bytes the whole-file XXH3 covers.
    if record.head_size is not None:
        head = xxh3(memoryview(data)[:record.head_size])
        if head != record.head_xxh3:
            raise CorruptionError(f"checksum mismatch in {full_path}: XXH3 {head:016x} of its first "
                                  f"{record.head_size} bytes but the commit marker ({COMMIT_FILE}) records "
                                  f"{record.head_xxh3:016x}; the checkpoint is corrupt, run `distckpt verify` and "
                                  "load an intact copy")


def open_regular(path: str) -> int:
    """A read-only descriptor of PATH, refused (CorruptionError) unless it is
    a regular file: a FIFO or device named by a checkpoint must not block or
    stream forever."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as e:
        raise from_os_error(e, "open for reading", path, missing_is_corruption=True) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise CorruptionError(f"{path} is not a regular file; the checkpoint is damaged")
    return fd


def read_small(root: str, relative: str, limit: int) -> bytes:
    path = inside(root, relative)
    fd = open_regular(path)
    check_opened(root, path, fd)
    with os.fdopen(fd, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise CorruptionError(f"{path} is larger than {limit} bytes; it is not a distckpt file")
    return data


def _what_is_there(root: str) -> str:
    """Why `root` is no checkpoint, in the terms of what it is."""
    foreign = ("the Python package reads distckpt checkpoints only; convert it first "
               "(distckpt convert SRC DST --to distckpt)")
    if not os.path.exists(root):
        return "the path does not exist"
    if os.path.isfile(root):
        if root.endswith(".safetensors") or root.endswith((".pt", ".pth", ".bin")):
            return f"it is a file of another format: {foreign}"
        return "it is a file, not a checkpoint directory"
    try:
        names = os.listdir(root)
    except OSError as e:
        return f"it cannot be listed ({e.strerror})"
    if any(n.endswith(".safetensors") or n.endswith(".safetensors.index.json") for n in names):
        return f"it holds safetensors files: {foreign}"
    return "a save that did not finish, or the wrong directory"


def load_commit_marker(root: str) -> CommitMarker:
    path = os.path.join(root, COMMIT_FILE)
    if not os.path.isfile(path):
        raise CheckpointError(f"{root} holds no committed distckpt checkpoint ({COMMIT_FILE} is missing): "
                              f"{_what_is_there(root)}")
    return parse_commit_marker(read_small(root, COMMIT_FILE, _MAX_COMMIT_BYTES), path)


# --- metadata.fb: decoding -----------------------------------------------

class _Decoder:
    """Copies a metadata buffer out record by record. Python's FlatBuffers
    bindings do not verify buffers, so every vector length is checked against
    the buffer size before it is walked, and any out-of-range access becomes
    a CorruptionError naming the file."""

    def __init__(self, buf: bytes, origin: str):
        self.buf, self.origin = buf, origin
        # Records may share tables, so the records decoded in all are charged
        # against the buffer size (each takes at least 4 bytes).
        self.budget = len(buf) // 4

    def charge(self, n, what):
        self.budget -= n
        if self.budget < 0:
            self.fail(f"{what}: more records than {len(self.buf)} bytes can hold (shared tables?)")

    def fail(self, what):
        raise CorruptionError(f"{self.origin}: {what}; the checkpoint metadata is corrupted")

    def count(self, n, elem_size, what):
        if n * elem_size > len(self.buf):
            self.fail(f"{what}: {n} entries cannot fit in {len(self.buf)} bytes")
        return n

    def longs(self, table, name):
        n = self.count(getattr(table, name + "Length")(), 8, name)
        return tuple(int(x) for x in getattr(table, name + "AsNumpy")()) if n else ()

    def checksums(self, table):
        n = self.count(table.BlockChecksumsLength(), 8, "block checksums")
        return table.BlockChecksumsAsNumpy().astype(np.uint64) if n else np.zeros(0, np.uint64)

    def text(self, value):
        return value.decode("utf-8") if value is not None else ""

    def decode(self) -> Metadata:
        if len(self.buf) < 8 or not _Meta.CheckpointMetadata.CheckpointMetadataBufferHasIdentifier(self.buf, 0):
            self.fail("not a distckpt metadata buffer (identifier DCKP missing)")
        root = _Meta.CheckpointMetadata.GetRootAs(self.buf, 0)
        version = root.FormatVersion()
        if version > READ_VERSION:
            raise CheckpointError(f"{self.origin}: written by a newer distckpt (version {version}); this reads "
                                  f"version {READ_VERSION}. Upgrade distckpt to load this checkpoint")
        if version < OLDEST_VERSION:
            self.fail(f"format_version {version} is not a valid version")
        world = root.WorldSize()
        if world < 1:
            self.fail(f"world_size is {world}, it must be at least 1")
        m = Metadata(world_size=world, block_size=root.ChecksumBlockSize(), tensors=[], objects=[], files=[],
                     format_version=version)
        if m.block_size > MAX_BLOCK_SIZE:
            self.fail(f"checksum blocks of {m.block_size} bytes, more than the {MAX_BLOCK_SIZE} a writer uses")
        seen = set()
        for i in range(self.count(root.FilesLength(), 4, "files")):
            self.charge(1, "files")
            r = root.Files(i)
            f = FileRecord(self.text(r.Path()), r.Size(), r.WriterRank())
            self.path(f.path, f"file {i}")
            if f.path in seen:
                self.fail(f"file '{f.path}' is listed twice")
            seen.add(f.path)
            if not 0 <= f.writer_rank < world:
                self.fail(f"file '{f.path}' has writer rank {f.writer_rank}, outside the world of {world} ranks")
            m.files.append(f)
        for i in range(self.count(root.TensorsLength(), 4, "tensors")):
            self.charge(1, "tensors")
            t = self.tensor(root.Tensors(i), m)
            if m.tensors and not m.tensors[-1].key.encode() < t.key.encode():
                self.fail(f"tensor keys are not sorted and unique: '{m.tensors[-1].key}' is followed by '{t.key}'")
            m.tensors.append(t)
        previous = None
        for i in range(self.count(root.ObjectsLength(), 4, "objects")):
            self.charge(1, "objects")
            o = self.object(root.Objects(i), m)
            if previous is not None and not previous.encode() < o.unique_key.encode():
                self.fail(f"object keys are not sorted and unique: '{previous}' is followed by '{o.unique_key}'")
            previous = o.unique_key
            m.objects.append(o)
        m.common_file = self.text(root.CommonFile())
        if m.common_file:
            self.path(m.common_file, "the common state file")
        m.layout_name = self.text(root.LayoutName())
        for f in m.files:  # rm-tensors deletes data files no longer used: never these
            if f.path in (COMMIT_FILE, COMMON_FILE, m.common_file) or f.path.startswith("metadata"):
                self.fail(f"file '{f.path}' has the name of a file that is not data")
        self.disjoint_bytes(m)
        return m

    def disjoint_bytes(self, m):
        """Each byte of a data file belongs to one record: records sharing
        bytes would let a small checkpoint claim any amount of data."""
        ranges = sorted((r.file, r.byte_offset, r.byte_offset + r.byte_length)
                        for r in [c for t in m.tensors for c in t.chunks] + m.objects if r.byte_length > 0)
        for (file_a, _, end_a), (file_b, begin_b, end_b) in zip(ranges, ranges[1:]):
            if file_a == file_b and begin_b < end_a:
                self.fail(f"two records share bytes [{begin_b}, {min(end_a, end_b)}) of '{m.files[file_a].path}'")

    def path(self, path, what):
        try:
            validate_relative(path)
        except CorruptionError as e:
            self.fail(f"{what}: {e}")

    def storage(self, what, file, offset, length, n_checksums, m):
        if file >= len(m.files):
            self.fail(f"{what} refers to file {file}, but the checkpoint has {len(m.files)} files")
        size = m.files[file].size
        if offset > size or length > size - offset:
            self.fail(f"{what} spans bytes [{offset}, +{length}) of '{m.files[file].path}', which has {size} bytes")
        expected = 0 if m.block_size == 0 else -(-length // m.block_size)
        if n_checksums != expected:
            self.fail(f"{what} has {n_checksums} block checksums, expected {expected} ({length} bytes in blocks "
                      f"of {m.block_size})")

    def tensor(self, r, m) -> TensorRecord:
        key = self.text(r.Key())
        if not key:
            self.fail("a tensor record has an empty key")
        dtype = self.text(r.Dtype())
        try:
            size = element_size_of(dtype, r.ElementSize())
        except CorruptionError as e:
            self.fail(f"tensor '{key}': {e}")
        shape = self.longs(r, "GlobalShape")
        if any(x < 0 for x in shape) or numel(shape) >= 1 << 63:
            self.fail(f"tensor '{key}' has global shape {list(shape)}: extents must be non-negative and the "
                      "element count must fit in int64")
        t = TensorRecord(key, dtype, shape, element_size=size)
        for i in range(self.count(r.ChunksLength(), 4, f"tensor '{key}' chunks")):
            self.charge(1, f"tensor '{key}' chunks")
            c = r.Chunks(i)
            where = f"tensor '{key}' chunk {i}"
            offset, length = self.longs(c, "Offset"), self.longs(c, "Length")
            if len(offset) != len(shape) or len(length) != len(shape):
                self.fail(f"{where}: box has offset rank {len(offset)} and length rank {len(length)}, but the "
                          f"tensor has rank {len(shape)}")
            for axis, (o, n, extent) in enumerate(zip(offset, length, shape)):
                if o < 0 or n < 0 or o > extent or n > extent - o:
                    self.fail(f"{where}: box offset {list(offset)} length {list(length)} lies outside the global "
                              f"shape {list(shape)} on axis {axis}")
            flat = None
            if c.FlatStart() != -1 or c.FlatStop() != -1:
                flat = (c.FlatStart(), c.FlatStop())
                if not 0 <= flat[0] < flat[1] <= numel(length):
                    self.fail(f"{where}: flat range [{flat[0]}, {flat[1]}) is empty or outside the box's "
                              f"{numel(length)} elements")
            chunk = ChunkRecord(offset, length, flat, c.File(), c.ByteOffset(), c.ByteLength(), self.checksums(c))
            if chunk.byte_length != chunk.stored_numel() * size:
                self.fail(f"{where}: byte length is {chunk.byte_length}, but {chunk.stored_numel()} elements of "
                          f"{dtype} take {chunk.stored_numel() * size} bytes")
            self.storage(where, chunk.file, chunk.byte_offset, chunk.byte_length, len(chunk.checksums), m)
            t.chunks.append(chunk)
        return t

    def object(self, r, m) -> ObjectRecord:
        key = self.text(r.Key())
        if not key:
            self.fail("an object record has an empty key")
        o = ObjectRecord(key, self.longs(r, "GlobalShape"), self.longs(r, "GlobalOffset"), r.File(), r.ByteOffset(),
                         r.ByteLength(), self.checksums(r))
        if len(o.global_shape) != len(o.global_offset) or any(
                not 0 <= off < n for off, n in zip(o.global_offset, o.global_shape)):
            self.fail(f"object '{key}': shard offset {list(o.global_offset)} is not inside the shard grid "
                      f"{list(o.global_shape)}")
        self.storage(f"object '{o.unique_key}'", o.file, o.byte_offset, o.byte_length, len(o.checksums), m)
        return o


def decode_metadata(buf: bytes, origin: str) -> Metadata:
    try:
        return _Decoder(buf, origin).decode()
    except (IndexError, struct.error, ValueError, UnicodeDecodeError, TypeError, OverflowError) as e:
        raise CorruptionError(f"{origin}: not a valid distckpt metadata buffer ({type(e).__name__}: {e}); the "
                              "checkpoint metadata is corrupted") from None


# --- metadata.fb: encoding -----------------------------------------------

def _longs(b, values):
    return b.CreateNumpyVector(np.asarray(values, dtype="<i8"))


def _ulongs(b, values):
    return b.CreateNumpyVector(np.asarray(values, dtype="<u8"))


def _tables(b, start_vector, offsets):
    start_vector(b, len(offsets))
    for o in reversed(offsets):
        b.PrependUOffsetTRelative(o)
    return b.EndVector()


def _add_storage(table, b, record, checksums):
    """Where a chunk's or an object's bytes are (the same fields in both tables)."""
    table.AddFile(b, record.file)
    table.AddByteOffset(b, record.byte_offset)
    table.AddByteLength(b, record.byte_length)
    table.AddBlockChecksums(b, checksums)


def encode_metadata(m: Metadata) -> bytes:
    """The buffer the C++ runtime reads: tensors sorted by key, objects by
    unique key (byte order, as std::string compares)."""
    b = flatbuffers.Builder(1 << 16)
    tensors = []
    for t in sorted(m.tensors, key=lambda t: t.key.encode()):
        chunks = []
        for c in t.chunks:
            offset = _longs(b, c.offset)
            length = _longs(b, c.length)
            sums = _ulongs(b, c.checksums)
            _Chunk.Start(b)
            _Chunk.AddOffset(b, offset)
            _Chunk.AddLength(b, length)
            if c.flat:
                _Chunk.AddFlatStart(b, c.flat[0])
                _Chunk.AddFlatStop(b, c.flat[1])
            _add_storage(_Chunk, b, c, sums)
            chunks.append(_Chunk.End(b))
        key, dtype = b.CreateString(t.key), b.CreateString(t.dtype)
        shape = _longs(b, t.shape)
        chunk_vector = _tables(b, _Tensor.StartChunksVector, chunks)
        _Tensor.Start(b)
        _Tensor.AddKey(b, key)
        _Tensor.AddDtype(b, dtype)
        _Tensor.AddGlobalShape(b, shape)
        _Tensor.AddChunks(b, chunk_vector)
        _Tensor.AddElementSize(b, element_size_of(t.dtype, t.element_size))
        tensors.append(_Tensor.End(b))
    objects = []
    for o in sorted(m.objects, key=lambda o: o.unique_key.encode()):
        key = b.CreateString(o.key)
        shape = _longs(b, o.global_shape)
        offset = _longs(b, o.global_offset)
        sums = _ulongs(b, o.checksums)
        _Object.Start(b)
        _Object.AddKey(b, key)
        _Object.AddGlobalShape(b, shape)
        _Object.AddGlobalOffset(b, offset)
        _add_storage(_Object, b, o, sums)
        objects.append(_Object.End(b))
    files = []
    for f in m.files:
        path = b.CreateString(f.path)
        _File.Start(b)
        _File.AddPath(b, path)
        _File.AddSize(b, f.size)
        _File.AddWriterRank(b, f.writer_rank)
        files.append(_File.End(b))
    tensor_vector = _tables(b, _Meta.StartTensorsVector, tensors)
    object_vector = _tables(b, _Meta.StartObjectsVector, objects)
    file_vector = _tables(b, _Meta.StartFilesVector, files)
    common = b.CreateString(m.common_file) if m.common_file else None
    policy = b.CreateString("python")
    _Meta.Start(b)
    _Meta.AddFormatVersion(b, WRITE_VERSION)
    _Meta.AddWorldSize(b, m.world_size)
    _Meta.AddChecksumBlockSize(b, m.block_size)
    _Meta.AddTensors(b, tensor_vector)
    _Meta.AddObjects(b, object_vector)
    _Meta.AddFiles(b, file_vector)
    if common is not None:
        _Meta.AddCommonFile(b, common)
    _Meta.AddWriterPolicy(b, policy)
    b.Finish(_Meta.End(b), file_identifier=b"DCKP")
    data = bytes(b.Output())
    if len(data) > _MAX_BUFFER:
        raise CheckpointError(f"the checkpoint metadata would take {len(data)} bytes, more than FlatBuffers' 2 GiB")
    return data


# --- durable files -------------------------------------------------------

def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data) -> None:
    view = memoryview(data).cast("B")
    while view:
        written = os.write(fd, view)
        view = view[written:]


def write_file_atomic(path: str, data: bytes) -> None:
    """Temp file, fsync, rename, directory fsync: PATH holds the old bytes or
    the new ones, never a part. IoError naming the file when a call fails."""
    temp = f"{path}.tmp"
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(temp, path)
        fsync_dir(os.path.dirname(path) or ".")
    except OSError as e:
        raise from_os_error(e, "atomic write of", path) from None
