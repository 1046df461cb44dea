"""common.fb, the common (non-sharded) state, as Python values: a tree of
None, bool, int (int64), float, str, CPU tensors, dicts with string keys and
lists (tuples are stored as lists). See the "common state" section of
schema/checkpoint.fbs; format/common_state.cpp is the C++ side."""
import math
import struct
from typing import Optional

import flatbuffers
import numpy as np
import torch

from ._errors import CheckpointError, CorruptionError, UsageError
from ._format import DTYPE_NAMES, OLDEST_VERSION, READ_VERSION, WRITE_VERSION, dtype_of, itemsize, name_of, numel

try:
    from .fb import CommonState as _State, Node as _Node
    from .fb.NodeKind import NodeKind
except ImportError as e:  # pragma: no cover
    raise ImportError("distckpt's FlatBuffers bindings (distckpt.fb) are missing; see distckpt/_format.py") from e

_IDENTIFIER = b"DCKC"
_MAX_NESTING = 48  # as the C++ runtime: deep enough for any training state
_INT64 = (-(1 << 63), (1 << 63) - 1)


def representable(value, depth=0) -> bool:
    """Whether VALUE can live in common.fb (and so be read by the C++ runtime
    as a common value); anything else is stored as a pickled object."""
    if depth > _MAX_NESTING:
        return False
    if value is None or isinstance(value, (bool, float, str)):
        return True
    if isinstance(value, int):
        return _INT64[0] <= value <= _INT64[1]
    if isinstance(value, torch.Tensor):
        return value.layout == torch.strided and value.dtype in DTYPE_NAMES and not value.is_quantized
    if isinstance(value, dict):
        return all(isinstance(k, str) and representable(v, depth + 1) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return all(representable(v, depth + 1) for v in value)
    return False


def encode(root: dict, content_metadata: Optional[dict] = None) -> bytes:
    """ROOT (and the save's CONTENT_METADATA dict, when given) as common.fb."""
    b = flatbuffers.Builder(1 << 12)
    node = _encode(b, root, None, [])
    content = None if content_metadata is None else _encode(b, content_metadata, None, ["<content_metadata>"])
    _State.Start(b)
    _State.AddFormatVersion(b, WRITE_VERSION)
    _State.AddRoot(b, node)
    if content is not None:
        _State.AddContentMetadata(b, content)
    b.Finish(_State.End(b), file_identifier=_IDENTIFIER)
    return bytes(b.Output())


def _encode(b, value, key, path):
    if len(path) > _MAX_NESTING:
        raise UsageError(f"common state at '{'/'.join(path)}': nested deeper than {_MAX_NESTING} levels")
    children = string = dtype = shape = data = None
    if isinstance(value, dict):
        kind = NodeKind.Dict
        items = sorted(value.items(), key=lambda kv: kv[0].encode())
        children = [_encode(b, v, k, path + [k]) for k, v in items]
    elif isinstance(value, (list, tuple)):
        kind = NodeKind.List
        children = [_encode(b, v, None, path + [str(i)]) for i, v in enumerate(value)]
    elif isinstance(value, str):
        kind, string = NodeKind.String, b.CreateString(value)
    elif isinstance(value, torch.Tensor):
        kind = NodeKind.Tensor
        t = value.detach().cpu().contiguous()
        dtype = b.CreateString(name_of(t.dtype))
        shape = b.CreateNumpyVector(np.asarray(t.shape, dtype="<i8"))
        data = b.CreateNumpyVector(t.reshape(-1).view(torch.uint8).numpy() if t.numel() else np.zeros(0, np.uint8))
    elif value is None:
        kind = NodeKind.None_
    elif isinstance(value, bool):
        kind = NodeKind.Bool
    elif isinstance(value, int):
        kind = NodeKind.Int
    elif isinstance(value, float):
        kind = NodeKind.Float
    else:
        raise UsageError(f"common state at '{'/'.join(path)}': a {type(value).__name__} cannot be stored")
    if children is not None:
        _Node.StartChildrenVector(b, len(children))
        for c in reversed(children):
            b.PrependUOffsetTRelative(c)
        children = b.EndVector()
    key_offset = b.CreateString(key) if key is not None else None
    _Node.Start(b)
    _Node.AddKind(b, kind)
    if key_offset is not None:
        _Node.AddKey(b, key_offset)
    if kind == NodeKind.Bool:
        _Node.AddBoolValue(b, value)
    elif kind == NodeKind.Int:
        _Node.AddIntValue(b, value)
    elif kind == NodeKind.Float:
        # A field equal to its default (0.0) is left out, and -0.0 == 0.0:
        # it must be written, or it reads back as +0.0.
        b.ForceDefaults(value == 0.0 and math.copysign(1.0, value) < 0)
        _Node.AddFloatValue(b, value)
        b.ForceDefaults(False)
    for add, offset in ((_Node.AddStringValue, string), (_Node.AddDtype, dtype), (_Node.AddShape, shape),
                        (_Node.AddData, data), (_Node.AddChildren, children)):
        if offset is not None:
            add(b, offset)
    return _Node.End(b)


def decode(buf: bytes, origin: str, content_metadata: bool = False):
    """The tree in BUF (or, with CONTENT_METADATA, the content metadata dict
    a save stored, None without one); a damaged buffer is a CorruptionError
    naming ORIGIN."""
    try:
        # (The generated CommonStateBufferHasIdentifier checks the schema-wide "DCKP".)
        if len(buf) < 8 or buf[4:8] != _IDENTIFIER:
            raise CorruptionError(f"{origin}: not a distckpt common state buffer (identifier DCKC missing)")
        state = _State.CommonState.GetRootAs(buf, 0)
        version = state.FormatVersion()
        if version > READ_VERSION:
            raise CheckpointError(f"{origin}: written by a newer distckpt (version {version}); this reads version "
                                  f"{READ_VERSION}. Upgrade distckpt to load this checkpoint")
        if version < OLDEST_VERSION:
            raise CorruptionError(f"{origin}: format_version {version} is not a valid version")
        if content_metadata:
            content = state.ContentMetadata()
            return None if content is None else _Decoder(buf, origin).node(content, ["<content_metadata>"])
        root = state.Root()
        if root is None:
            raise CorruptionError(f"{origin}: the root node is missing")
        return _Decoder(buf, origin).node(root, [])
    except (IndexError, struct.error, ValueError, UnicodeDecodeError, TypeError, OverflowError) as e:
        raise CorruptionError(f"{origin}: not a valid distckpt common state buffer ({type(e).__name__}: {e}); the "
                              "file is corrupted") from None


class _Decoder:
    def __init__(self, buf, origin):
        self.buf, self.origin = buf, origin
        # Nodes may share children, so a small buffer could describe an
        # exponential tree: every node visited is charged (a node takes at
        # least 4 bytes, as the C++ decoder's ExpansionBudget assumes).
        self.budget = len(buf) // 4

    def fail(self, path, what):
        raise CorruptionError(f"{self.origin}: common state at '{'/'.join(path) or '<root>'}': {what}; the file is "
                              "corrupted")

    def count(self, n, path):
        if n * 4 > len(self.buf):
            self.fail(path, f"{n} entries cannot fit in {len(self.buf)} bytes")
        return n

    def node(self, n, path):
        if len(path) > _MAX_NESTING:
            self.fail(path, f"nested deeper than {_MAX_NESTING} levels")
        self.budget -= 1
        if self.budget < 0:
            self.fail(path, f"more nodes than {len(self.buf)} bytes can hold (shared children?)")
        kind = n.Kind()
        if kind == NodeKind.None_:
            return None
        if kind == NodeKind.Bool:
            return bool(n.BoolValue())
        if kind == NodeKind.Int:
            return int(n.IntValue())
        if kind == NodeKind.Float:
            return float(n.FloatValue())
        if kind == NodeKind.String:
            if n.StringValue() is None:
                self.fail(path, "a string node has no string")
            return n.StringValue().decode("utf-8")
        if kind == NodeKind.Tensor:
            return self.tensor(n, path)
        if kind == NodeKind.Dict:
            out, previous = {}, None
            for i in range(self.count(n.ChildrenLength(), path)):
                child = n.Children(i)
                if child.Key() is None:
                    self.fail(path, f"dict entry {i} has no key")
                key = child.Key()
                if previous is not None and not previous < key:
                    self.fail(path, f"dict keys are not sorted and unique: '{key.decode()}' follows "
                                    f"'{previous.decode()}'")
                previous = key
                name = key.decode("utf-8")
                out[name] = self.node(child, path + [name])
            return out
        if kind == NodeKind.List:
            return [self.node(n.Children(i), path + [str(i)]) for i in range(self.count(n.ChildrenLength(), path))]
        self.fail(path, f"unknown node kind {kind} (written by a newer distckpt?)")

    def tensor(self, n, path):
        if n.Dtype() is None or n.ShapeIsNone() or n.DataIsNone():
            self.fail(path, "a tensor node lacks its dtype, shape or data")
        try:
            dtype = dtype_of(n.Dtype().decode("utf-8"))
        except CorruptionError as e:
            self.fail(path, str(e))
        except CheckpointError as e:  # a valid dtype this torch lacks: not damage
            raise CheckpointError(f"a tensor of the common state at {'/'.join(path) or '<root>'}: {e}") from None
        shape = [int(x) for x in n.ShapeAsNumpy()] if n.ShapeLength() else []
        if any(extent < 0 for extent in shape):
            self.fail(path, f"tensor shape {shape} has a negative extent")
        count = numel(shape)
        if count * itemsize(dtype) != n.DataLength():
            self.fail(path, f"tensor of {dtype} and shape {shape} has {n.DataLength()} data bytes, which does not "
                            "match")
        if count == 0:
            return torch.empty(shape, dtype=dtype)
        raw = torch.from_numpy(np.array(n.DataAsNumpy(), dtype=np.uint8, copy=True))
        return raw.view(dtype).reshape(shape)
