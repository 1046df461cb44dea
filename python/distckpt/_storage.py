"""An opened checkpoint: the commit marker checked, metadata.fb and common.fb
verified against it and decoded, and byte ranges of stored chunks read with
every checksum block they touch verified."""
import collections
import os
import threading

import torch

from . import _common
from ._errors import CorruptionError, from_os_error
from ._format import (METADATA_FILE, check_recorded, decode_metadata, load_commit_marker, open_regular,
                      read_small, xxh3)
from ._paths import check_opened, inside

_MAX_METADATA = (1 << 31) - 1
_OPEN_FILES = 64  # descriptors kept open at once, whatever the number of data files


class Checkpoint:
    def __init__(self, path: str):
        self.path = os.fspath(path)
        self.marker = load_commit_marker(self.path)
        raw = read_small(self.path, self.marker.metadata.path if self.marker.metadata else METADATA_FILE,
                         _MAX_METADATA)
        origin = os.path.join(self.path, METADATA_FILE)
        if self.marker.metadata:
            check_recorded(self.marker.metadata, raw, origin)
        self.metadata = decode_metadata(raw, origin)
        self._common = None
        self._fds = collections.OrderedDict()
        self._lock = threading.Lock()
        self.bytes_read = 0

    # -- the common state, read on first use --

    def _common_bytes(self):
        """common.fb's bytes, checked against the marker, and its path."""
        raw = read_small(self.path, self.metadata.common_file, _MAX_METADATA)
        origin = os.path.join(self.path, self.metadata.common_file)
        if self.marker.common:
            check_recorded(self.marker.common, raw, origin)
        return raw, origin

    def common_state(self) -> dict:
        if self._common is None:
            if not self.metadata.common_file:
                self._common = {}
            else:
                value = _common.decode(*self._common_bytes())
                if not isinstance(value, dict):
                    raise CorruptionError(f"{self.path}: the root of the common state is not a dict")
                self._common = value
        return self._common

    def content_metadata(self):
        """The dict the save stored as its content metadata; None without one."""
        if not self.metadata.common_file:
            return None
        raw, origin = self._common_bytes()
        value = _common.decode(raw, origin, content_metadata=True)
        if value is not None and not isinstance(value, dict):
            raise CorruptionError(f"{origin}: the content metadata is a {type(value).__name__}, not a dict")
        return value

    # -- stored bytes --

    def _fd(self, file_index: int) -> int:
        with self._lock:
            fd = self._fds.get(file_index)
            if fd is not None:
                self._fds.move_to_end(file_index)
                return fd
            record = self.metadata.files[file_index]
            full = inside(self.path, record.path)
            fd = open_regular(full)
            check_opened(self.path, full, fd)
            size = os.fstat(fd).st_size
            if size != record.size:
                os.close(fd)
                raise CorruptionError(f"{full} has {size} bytes but the checkpoint metadata records {record.size}: "
                                      "the file was truncated or replaced; the checkpoint is corrupt")
            self._fds[file_index] = fd
            while len(self._fds) > _OPEN_FILES:
                os.close(self._fds.popitem(last=False)[1])
            return fd

    def read(self, record, begin: int, end: int, what: str) -> torch.Tensor:
        """Bytes [BEGIN, END) of a stored chunk or object RECORD as a uint8
        tensor. The whole checksum blocks that cover them are read and checked;
        a mismatch names WHAT, the file and the offset."""
        block = self.metadata.block_size
        first, stop = begin, end
        if block:
            first = begin // block * block
            stop = min(-(-end // block) * block, record.byte_length)
        buf = torch.empty(stop - first, dtype=torch.uint8)
        if stop > first:
            self._pread(record.file, record.byte_offset + first, buf.numpy(), what)
        if block:
            view = memoryview(buf.numpy())
            for k, at in enumerate(range(0, stop - first, block)):
                index = first // block + k
                actual = xxh3(view[at:at + block])
                if actual != int(record.checksums[index]):
                    f = self.metadata.files[record.file].path
                    raise CorruptionError(
                        f"checksum mismatch in {os.path.join(self.path, f)} at byte "
                        f"{record.byte_offset + first + at} ({what}, block {index}): XXH3 {actual:016x}, recorded "
                        f"{int(record.checksums[index]):016x}; the checkpoint is corrupt, run `distckpt verify` and "
                        "load an intact copy")
        return buf[begin - first:end - first]

    def _pread(self, file_index, offset, out, what):
        fd = self._fd(file_index)
        view = memoryview(out)
        done = 0
        while done < len(view):
            try:
                n = os.preadv(fd, [view[done:]], offset + done)
            except OSError as e:
                path = os.path.join(self.path, self.metadata.files[file_index].path)
                raise from_os_error(e, f"read of {len(view) - done} bytes at offset {offset + done} from", path) from None
            if n == 0:
                raise CorruptionError(f"{os.path.join(self.path, self.metadata.files[file_index].path)} ends before "
                                      f"byte {offset + len(view)} ({what}); the checkpoint is corrupt")
            done += n
        with self._lock:
            self.bytes_read += done

    def close(self):
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
