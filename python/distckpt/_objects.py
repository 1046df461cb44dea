"""Objects of a checkpoint are untrusted input. A stored object is a
torch.save archive, and unpickling it with torch.load (or pickle) runs
whatever its pickle names: a crafted object whose __reduce__ is os.system
runs a command in the reading process. `decode` rebuilds the value with a
restricted unpickler instead:

- Only the globals of the allow-list (`_entries`) resolve: what checkpoints
  hold (containers, numbers, argparse.Namespace, numpy arrays and scalars,
  RNG states, torch dtypes, torch.Size, tensors and parameters, io.BytesIO
  as Transformer Engine's extra state, Megatron's enums). Nothing else is
  imported, looked up or called; the refusal names the global.
- Only the callables among them are called (REDUCE, NEWOBJ), each through a
  guard that checks its arguments (collections from lists and tuples only,
  a numpy array from numpy's own empty template, tensors from the archive's
  own storages with no backward hooks, ...). Classes that are values only
  (torch.Tensor, numpy.ndarray, builtins.list, ...) are never called.
- BUILD (setting an object's state) applies only to an object the pickle has
  just made through the allow-list, once, and never sets an attribute its
  class defines (no __reduce_ex__, no methods), so no class, function or
  shared singleton (a dtype, an enum member) is ever changed. A numpy dtype
  state is checked against what numpy itself makes of the dtype (the flags
  that say "holds objects" cannot be forged), and an array's state against
  its shape (numpy trusts a list of objects shorter than the array).
- APPEND, SETITEM and ADDITEMS reach only lists, deques, dicts and sets;
  EXT*, INST and OBJ (which torch.save never writes) are refused.
- Storages come from the archive's own records (data/<key>), exactly as
  large as the persistent id says, always on the CPU.

The reader gives DCP the value re-saved with torch.save (DCP's planners take
bytes and torch.load them), so what any planner unpickles was made here from
allow-listed parts. The writer uses `decode` to tell plain values (stored in
common.fb) from objects, so a save never unpickles what it stores either.
"""
import _compat_pickle
import argparse
import collections
import datetime
import enum
import importlib
import io
import pathlib
import pickle
import sys
import types
import zipfile
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Optional

import numpy as np
import torch

from . import _dcp
from ._errors import CorruptionError, Error, UntrustedObjectError

TORCH_ARCHIVE = b"PK\x03\x04"  # torch.save's zip archive

TRUST_HINT = ("A checkpoint is untrusted input: unpickling this could run code in this process, so distckpt rebuilds "
              "only what checkpoints hold (docs/PYTHON.md, \"Objects are untrusted input\"). If you trust this "
              "checkpoint, read it with distckpt.FileSystemReader(path, trust_objects=True), which loads objects "
              "with torch.load")


class _Refused(Exception):
    """The pickle asks for something the restricted unpickler does not do."""

    def __init__(self, reason: str, global_name: Optional[str] = None):
        super().__init__(reason)
        self.reason, self.global_name = reason, global_name


def decode(raw: bytes, key: str, origin: str, stored_as: Optional[str] = None):
    """The value of the torch.save archive RAW (object KEY, STORED_AS its
    unique key, of the checkpoint at ORIGIN), rebuilt by the restricted
    unpickler. Raises UntrustedObjectError for anything off the allow-list,
    CorruptionError for an archive or pickle that cannot be read."""
    what = f"{origin}: object '{key}'" + (f" (stored as '{stored_as}')" if stored_as not in (None, key) else "")
    try:
        archive = _Archive(raw)
        return _Unpickler(io.BytesIO(bytes(archive.read("data.pkl"))), archive).load()
    except _Refused as e:
        raise UntrustedObjectError(f"{what}: {e.reason}. {TRUST_HINT}", key, e.global_name) from None
    except Error:
        raise
    except Exception as e:  # malformed archive or pickle, or arguments an allowed callable rejects
        raise CorruptionError(f"{what} is not a torch.save archive the restricted unpickler can read "
                              f"({type(e).__name__}: {e}). {TRUST_HINT}") from None


class _Archive:
    """The records of a torch.save zip archive, all under one top-level folder."""

    def __init__(self, raw: bytes):
        self.size = len(raw)
        self.zip = zipfile.ZipFile(io.BytesIO(raw))
        pickles = [n for n in self.zip.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
        if len(pickles) != 1:
            raise ValueError(f"{len(pickles)} top-level data.pkl records, not 1")
        self.prefix = pickles[0][:-len("data.pkl")]
        order = self.read("byteorder", missing_ok=True)  # written by torch >= 2.1
        if order is not None and bytes(order).decode("ascii", "replace") != sys.byteorder:
            raise _Refused(f"it was saved in {bytes(order).decode('ascii', 'replace')}-endian byte order, which the "
                           "restricted unpickler does not convert")

    def read(self, name: str, missing_ok: bool = False) -> Optional[bytearray]:
        try:
            info = self.zip.getinfo(self.prefix + name)
        except KeyError:
            if missing_ok:
                return None
            raise ValueError(f"the archive has no record '{self.prefix + name}'") from None
        if info.compress_type != zipfile.ZIP_STORED:
            raise ValueError(f"record '{info.filename}' is compressed (torch.save stores records as they are)")
        if info.file_size > self.size:  # stored, so inside the archive: never allocate what it claims beyond that
            raise ValueError(f"record '{info.filename}' claims {info.file_size} bytes in a {self.size}-byte archive")
        out = bytearray(info.file_size)
        view, done = memoryview(out), 0
        with self.zip.open(info) as f:  # checks the record's CRC-32 at its end
            while done < len(out):
                n = f.readinto(view[done:])
                if not n:
                    raise ValueError(f"record '{info.filename}' ends early")
                done += n
            if f.read(1):
                raise ValueError(f"record '{info.filename}' is longer than its size")
        return out


# -- the allow-list --

@dataclass(frozen=True)
class _Entry:
    """A global the pickle may name. OBJ is what it resolves to (the real
    object, so values keep their identity). CALL, when set, is what REDUCE
    runs for it (a guard over the real callable); NEWOBJ: the class may be
    made with cls.__new__(cls). FRESH names the BUILD the new object accepts
    ("attrs", "array", "dtype", "bytesio")."""
    obj: object
    call: Optional[Callable] = None
    newobj: bool = False
    fresh: Optional[str] = None


class _StorageType:
    """What a storage class name ("torch.FloatStorage") stands for in a
    persistent id: its dtype. Never a class, never called."""

    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype


def _items(what, items):
    if type(items) not in (list, tuple):
        raise _Refused(f"its pickle makes a {what} from a {type(items).__name__}, not from a list or tuple")
    return items


def _plain(what, args, kinds):
    for a in args:
        if not isinstance(a, kinds):
            raise _Refused(f"its pickle makes a {what} from a {type(a).__name__}")
    return args


def _is_latin1(name) -> bool:
    return type(name) is str and name in ("latin1", "latin-1", "latin_1")


def _bytes_from(what, args):
    if not args:
        return b""
    if len(args) == 1 and isinstance(args[0], (bytes, bytearray)):
        return bytes(args[0])
    if len(args) == 2 and isinstance(args[0], str) and _is_latin1(args[1]):
        return args[0].encode("latin-1")
    raise _Refused(f"its pickle makes {what} from {tuple(type(a).__name__ for a in args)}")


def _encode(text, encoding="utf-8", errors="strict"):
    """_codecs.encode as pickle protocol 2 writes bytes: (str, 'latin1')."""
    if not isinstance(text, str) or not _is_latin1(encoding) or type(errors) is not str or errors != "strict":
        raise _Refused("its pickle calls _codecs.encode otherwise than (text, 'latin1')")
    return text.encode("latin-1")


def _slice(*args):
    return slice(*_plain("slice", args, (int, type(None))))


def _complex(*args):
    return complex(*_plain("complex", args, (int, float)))


def _defaultdict(factory=None, items=None):
    if factory is not None and not any(factory is f for f in _FACTORIES):
        raise _Refused(f"its pickle makes a defaultdict whose factory is {_describe(factory)}")
    return collections.defaultdict(factory, {} if items is None else _pairs(items))


def _pairs(items):
    return dict(_items("dict", items))


def _deque(items=(), maxlen=None):
    if maxlen is not None and type(maxlen) is not int:
        raise _Refused("its pickle makes a deque whose maxlen is no int")
    return collections.deque(_items("deque", items), maxlen)


def _new(cls, what):
    def make():
        return cls()
    make.__name__ = what
    return make


def _path(cls):
    def make(*parts):
        return cls(*_plain(cls.__name__, parts, str))
    return make


def _datetime(cls):
    kinds = (int, float, bytes, str, type(None), datetime.timedelta, datetime.timezone)

    def make(*args):
        return cls(*_plain(cls.__name__, args, kinds))
    return make


def _np_reconstruct(subtype, shape, dtype):
    """numpy's _reconstruct as ndarray.__reduce__ writes it: the empty int8
    template that BUILD fills. Nothing else (no other subtype or shape)."""
    if subtype is not np.ndarray or type(shape) is not tuple or shape != (0,) or type(dtype) not in (bytes, str) \
            or dtype not in (b"b", "b"):
        raise _Refused("its pickle calls numpy's _reconstruct otherwise than numpy does")
    return np.empty((0,), dtype=np.int8)


def _np_frombuffer(buf, dtype, shape, order):
    """numpy's _frombuffer (an array under pickle protocol 5): the buffer
    must hold exactly the shape's items of a dtype without objects."""
    if not isinstance(buf, (bytes, bytearray)) or not isinstance(dtype, np.dtype) or dtype.hasobject \
            or type(shape) is not tuple or not all(type(n) is int and n >= 0 for n in shape) \
            or type(order) is not str or order not in ("C", "F"):
        raise _Refused("its pickle calls numpy's _frombuffer otherwise than numpy does")
    count = 1
    for n in shape:
        count *= n
    if dtype.itemsize == 0 or len(buf) != count * dtype.itemsize:
        raise _Refused(f"its pickle gives a numpy array of {count} x {dtype.itemsize} bytes other than as many bytes")
    return np.frombuffer(buf, dtype=dtype).reshape(shape, order=order)


def _np_dtype(spec, align=False, copy=True):
    if not isinstance(spec, str) or type(align) is not bool:
        raise _Refused(f"its pickle makes a numpy dtype from a {type(spec).__name__}")
    return np.dtype(spec, align, True)  # always a copy: numpy's built-in dtypes are shared


def _np_scalar(dtype, data=None):
    if not isinstance(dtype, np.dtype):
        raise _Refused("its pickle makes a numpy scalar of something that is not a dtype")
    if dtype.hasobject:
        if dtype.char != "O":
            raise _Refused(f"its pickle makes a numpy scalar of dtype {dtype}")
        return data  # numpy gives the object back
    if not isinstance(data, bytes) or len(data) != dtype.itemsize:
        raise _Refused(f"its pickle makes a numpy scalar of dtype {dtype} from other than {dtype.itemsize} bytes")
    scalar = _numpy_function("scalar")
    if scalar is None:
        raise _Refused("this numpy has no multiarray.scalar")
    return scalar(dtype, data)


@lru_cache(maxsize=None)
def _numpy_function(name, module="multiarray"):
    """numpy 2's numpy._core.MODULE.NAME, or numpy 1's numpy.core; None if neither."""
    for qualified in (f"numpy._core.{module}", f"numpy.core.{module}"):
        try:
            return getattr(importlib.import_module(qualified), name)
        except (ImportError, AttributeError):
            continue
    return None


def _torch_size(dims=()):
    if not all(type(d) is int for d in _items("torch.Size", dims)):
        raise _Refused("its pickle makes a torch.Size of other than ints")
    return torch.Size(dims)


def _torch_device(*args):
    return torch.device(*_plain("torch.device", args, (str, int)))


def _shape(what, dims):
    if type(dims) not in (tuple, list, torch.Size) or not all(type(d) is int and d >= 0 for d in dims):
        raise _Refused(f"its pickle gives a tensor a {what} that is not a tuple of non-negative ints")
    return tuple(dims)


def _no_hooks(hooks):
    if hooks is not None and (not isinstance(hooks, dict) or hooks):
        raise _Refused("its pickle gives a tensor backward hooks")


def _storage(storage):
    # Only persistent_load makes storages: no allow-listed callable does.
    if not isinstance(storage, _dcp.TypedStorage):
        raise _Refused(f"its pickle builds a tensor over a {type(storage).__name__}, not over a stored storage")
    return storage


def _rebuild_tensor(storage, storage_offset, size, stride):
    if type(storage_offset) is not int or storage_offset < 0:
        raise _Refused("its pickle gives a tensor a storage offset that is no non-negative int")
    # set_ checks that the view stays inside the storage.
    return torch._utils._rebuild_tensor(_storage(storage), storage_offset, _shape("size", size),
                                        _shape("stride", stride))


def _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks, metadata=None):
    _no_hooks(backward_hooks)
    if metadata:
        raise _Refused("its pickle gives a tensor metadata (conjugate or negative bits)")
    t = _rebuild_tensor(storage, storage_offset, size, stride)
    t.requires_grad = bool(requires_grad)
    return t


def _rebuild_parameter(data, requires_grad, backward_hooks):
    if not isinstance(data, torch.Tensor):
        raise _Refused(f"its pickle makes a parameter of a {type(data).__name__}")
    _no_hooks(backward_hooks)
    return torch.nn.Parameter(data, bool(requires_grad))


def _rebuild_parameter_with_state(data, requires_grad, backward_hooks, state):
    return _set_attributes(_rebuild_parameter(data, requires_grad, backward_hooks), state)


def _rebuild_from_type_v2(func, new_type, args, state):
    """A tensor (or parameter) with Python attributes: FUNC(*ARGS) must be
    one of the guarded rebuild functions, NEW_TYPE torch.Tensor or
    torch.nn.Parameter; STATE sets instance attributes only."""
    rebuild = _TENSOR_REBUILDS.get(id(func))
    if rebuild is None or rebuild[0] is not func:
        raise _Refused(f"its pickle rebuilds a tensor with {_describe(func)}")
    if new_type is not torch.Tensor and new_type is not torch.nn.Parameter:
        raise _Refused(f"its pickle makes a tensor of class {_describe(new_type)}")
    t = rebuild[1](*_items("tensor", args))
    if type(t) is not new_type:
        t = t.as_subclass(new_type)
    return _set_attributes(t, state)


def _set_attributes(obj, state):
    """BUILD's state (a dict, or (dict, slot dict)) as instance attributes:
    never a name the class defines (methods, properties, __reduce_ex__)."""
    slots = None
    if type(state) is tuple and len(state) == 2:
        state, slots = state
    for part in (state, slots):
        if part is None:
            continue
        if type(part) is not dict:
            raise _Refused(f"its pickle sets the state of a {type(obj).__name__} from a {type(part).__name__}")
        for name, value in part.items():
            if type(name) is not str or name.startswith("__") or hasattr(type(obj), name):
                raise _Refused(f"its pickle sets the attribute {name!r} of a {type(obj).__name__}, which its class "
                               "defines")
            setattr(obj, name, value)
    return obj


def _small_int(x) -> bool:
    return type(x) is int and -1 <= x < (1 << 31)


def _check_dtype_state(state):
    """The state tuples numpy writes for a dtype that is not structured:
    (3, byte order, None, None, None, size, alignment, flags), and version 4
    with a datetime's unit: ({}, (unit, count, 1, 1)). Anything else is
    refused before numpy parses it."""
    ok = type(state) is tuple and len(state) in (8, 9) and state[0] == len(state) - 5 and type(state[0]) is int \
        and type(state[1]) is str and state[1] in ("<", ">", "|", "=") \
        and state[2] is None and state[3] is None and state[4] is None and all(_small_int(x) for x in state[5:8])
    if ok and len(state) == 9:
        meta = state[8]
        ok = type(meta) is tuple and len(meta) == 2 and type(meta[0]) is dict and not meta[0] \
            and type(meta[1]) is tuple and len(meta[1]) == 4 and type(meta[1][0]) is bytes \
            and all(_small_int(x) and x > 0 for x in meta[1][1:])
    if not ok:
        raise _Refused("its pickle sets the state of a numpy dtype from other than the state numpy writes for an "
                       "array's dtype (structured dtypes and dtypes with metadata are not rebuilt)")


def _identity_list(data):
    return list(_items("list", data))


def _restore_type_tag(value, type_str):
    return value  # LibTorch's pickler tags containers with their TorchScript type; Python ignores it


def _enum_member(cls, name):
    """getattr(EnumClass, 'MEMBER'): how Python pickles enum members; only
    for an allow-listed enum and one of its members."""
    qualified = f"{cls.__module__}.{cls.__qualname__}" if isinstance(cls, type) else None
    entry = _lookup(qualified) if qualified in MEGATRON_ENUMS else None
    if entry is None or entry.obj is not cls or type(name) is not str or name not in cls.__members__:
        raise _Refused(f"its pickle calls getattr({_describe(cls)}, {name!r})", "builtins.getattr")
    return cls.__members__[name]


def _enum_call(cls):
    def make(value):
        return cls(value)  # one argument: a lookup, never the functional API that makes classes
    return make


def _describe(obj) -> str:
    if isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType)):
        return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', obj.__name__)}"
    return f"a {type(obj).__module__}.{type(obj).__qualname__}"


_DICTS = (dict, collections.OrderedDict, collections.defaultdict)
_FACTORIES = (list, dict, set, tuple, int, float, str, bool, collections.OrderedDict)

_TENSOR_REBUILDS = {}  # id(torch's function) -> (torch's function, guard)
for _real, _guard in ((torch._utils._rebuild_tensor, _rebuild_tensor),
                      (torch._utils._rebuild_tensor_v2, _rebuild_tensor_v2),
                      (torch._utils._rebuild_parameter, _rebuild_parameter),
                      (getattr(torch._utils, "_rebuild_parameter_with_state", None), _rebuild_parameter_with_state)):
    if _real is not None:
        _TENSOR_REBUILDS[id(_real)] = (_real, _guard)

# Megatron-LM's own `safe_globals` (megatron/core/safe_globals.py): enums its
# checkpoints hold. Imported only when a pickle names one; must be an Enum.
MEGATRON_ENUMS = ("megatron.core.enums.ModelType", "megatron.core.transformer.enums.AttnBackend",
                  "megatron.core.rerun_state_machine.RerunDiagnostic",
                  "megatron.core.rerun_state_machine.RerunMode", "megatron.core.rerun_state_machine.RerunState")


@lru_cache(maxsize=None)
def _megatron_enum(name) -> Optional[_Entry]:
    module, _, attr = name.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError):
        return None
    if not (isinstance(cls, type) and issubclass(cls, enum.Enum)):
        return None
    return _Entry(cls, call=_enum_call(cls))


@lru_cache(maxsize=1)
def _entries():
    """The allow-list: "module.name" -> _Entry."""
    e = {}

    def call(names, obj, fn=None, **kw):
        if obj is None:  # not in this numpy or torch
            return
        for n in names.split():
            e[n] = _Entry(obj, call=fn if fn is not None else obj, **kw)

    def value(names, obj):
        for n in names.split():
            e[n] = _Entry(obj)

    # Python: containers, numbers, bytes as pickle protocol 2 writes them.
    call("builtins.set", set, lambda items=(): set(_items("set", items)))
    call("builtins.frozenset", frozenset, lambda items=(): frozenset(_items("frozenset", items)))
    call("builtins.slice", slice, _slice)
    call("builtins.complex", complex, _complex)
    call("builtins.bytes", bytes, lambda *a: _bytes_from("bytes", a))
    call("builtins.bytearray", bytearray, lambda *a: bytearray(_bytes_from("a bytearray", a)))
    call("_codecs.encode codecs.encode", __import__("codecs").encode, _encode)
    call("builtins.getattr", getattr, _enum_member)
    for t in (list, dict, tuple, int, float, str, bool):  # values only (a defaultdict's factory)
        value(f"builtins.{t.__name__}", t)
    call("collections.OrderedDict", collections.OrderedDict,
         lambda items=(): collections.OrderedDict(_items("OrderedDict", items)), fresh="attrs")
    call("collections.defaultdict", collections.defaultdict, _defaultdict, fresh="attrs")
    call("collections.deque", collections.deque, _deque, fresh="attrs")
    call("argparse.Namespace", argparse.Namespace, _new(argparse.Namespace, "Namespace"), newobj=True, fresh="attrs")
    call("types.SimpleNamespace", types.SimpleNamespace, _new(types.SimpleNamespace, "SimpleNamespace"),
         newobj=True, fresh="attrs")
    # Transformer Engine's extra state (older releases): a buffer of bytes, as opaque as a bytes object.
    call("io.BytesIO _io.BytesIO", io.BytesIO, lambda *a: io.BytesIO(_bytes_from("a BytesIO", a)), newobj=True,
         fresh="bytesio")
    call("pathlib.PosixPath", pathlib.PosixPath, _path(pathlib.PosixPath))
    call("pathlib.PurePosixPath", pathlib.PurePosixPath, _path(pathlib.PurePosixPath))
    for t in (datetime.date, datetime.time, datetime.datetime, datetime.timedelta, datetime.timezone):
        call(f"datetime.{t.__name__}", t, _datetime(t))
    # numpy: arrays, dtypes and scalars (RNG states are tuples of these).
    call("numpy.core.multiarray._reconstruct numpy._core.multiarray._reconstruct", _numpy_function("_reconstruct"),
         _np_reconstruct, fresh="array")
    call("numpy.core.multiarray.scalar numpy._core.multiarray.scalar", _numpy_function("scalar"), _np_scalar)
    call("numpy.core.numeric._frombuffer numpy._core.numeric._frombuffer", _numpy_function("_frombuffer", "numeric"),
         _np_frombuffer)
    call("numpy.dtype", np.dtype, _np_dtype, fresh="dtype")
    value("numpy.ndarray", np.ndarray)
    # torch: tensors and parameters over the archive's storages, sizes, devices.
    call("torch.Size", torch.Size, _torch_size)
    call("torch.device", torch.device, _torch_device)
    value("torch.Tensor torch._tensor.Tensor", torch.Tensor)
    value("torch.nn.parameter.Parameter", torch.nn.Parameter)
    for real, guard in _TENSOR_REBUILDS.values():
        call(f"torch._utils.{real.__name__}", real, guard)
    call("torch._tensor._rebuild_from_type_v2 torch.tensor._rebuild_from_type_v2",
         getattr(torch._tensor, "_rebuild_from_type_v2", None), _rebuild_from_type_v2)
    # LibTorch's pickler (torch::pickle_save): identity functions in Python.
    for name in ("build_intlist", "build_tensorlist", "build_doublelist", "build_boollist"):
        call(f"torch.jit._pickle.{name}", _jit_pickle(name), _identity_list)
    call("torch.jit._pickle.restore_type_tag", _jit_pickle("restore_type_tag"), _restore_type_tag)
    return e


def _jit_pickle(name):
    try:
        return getattr(importlib.import_module("torch.jit._pickle"), name)
    except (ImportError, AttributeError):
        return None


@lru_cache(maxsize=1024)
def _lookup(name: str) -> Optional[_Entry]:
    """The allow-list, including the names that follow a rule: torch's
    dtypes (and layouts, memory formats, qschemes), storage classes (as
    _StorageType), numpy's scalar types and dtype classes, Megatron's enums.
    Module attributes are read from the module's dict: a lazy module
    __getattr__ (torch's, numpy's) is never asked to import anything."""
    entry = _entries().get(name)
    if entry is not None:
        return entry
    module, _, attr = name.rpartition(".")
    if module == "torch":
        obj = vars(torch).get(attr)
        if isinstance(obj, (torch.dtype, torch.layout, torch.memory_format, torch.qscheme)):
            return _Entry(obj)
    if module in ("torch", "torch.cuda", "torch.storage") and attr.endswith("Storage"):
        dtype = _storage_dtypes().get(attr)
        return None if dtype is None else _Entry(_storage_type(dtype))
    if module == "numpy":
        obj = vars(np).get(attr)
        if isinstance(obj, type) and issubclass(obj, np.generic):
            return _Entry(obj)
    if module == "numpy.dtypes":
        try:
            obj = vars(importlib.import_module("numpy.dtypes")).get(attr)  # numpy >= 1.25
        except ImportError:
            obj = None
        if isinstance(obj, type) and issubclass(obj, np.dtype):
            return _Entry(obj)
    if name in MEGATRON_ENUMS:
        return _megatron_enum(name)
    return None


@lru_cache(maxsize=None)
def _storage_dtypes():
    """Storage class name -> dtype: the typed classes torch.save names
    (FloatStorage, BFloat16Storage, ...) and the untyped one (bytes).
    Quantized storages are left out (their tensors need _rebuild_qtensor)."""
    quantized = {getattr(torch, n) for n in ("qint8", "quint8", "qint32", "quint4x2", "quint2x4") if hasattr(torch, n)}
    out = {"UntypedStorage": torch.uint8, "_UntypedStorage": torch.uint8}
    for name, cls in list(vars(torch).items()):
        if name.endswith("Storage") and isinstance(cls, type):
            dtype = getattr(cls, "dtype", None)  # the generic classes have none, or a property
            if isinstance(dtype, torch.dtype):
                out[name] = dtype
    names = getattr(torch.storage, "_dtype_to_storage_type_map", None)  # 2.x: also dtypes without a class
    for dtype, name in (names() if names is not None else {}).items():
        out.setdefault(name, dtype)
    return {name: dtype for name, dtype in out.items() if dtype not in quantized}


@lru_cache(maxsize=None)
def _storage_type(dtype):
    return _StorageType(dtype)


def allowed_globals():
    """The names of the fixed allow-list (besides the rules of _lookup), for documentation and tests."""
    return sorted(_entries())


# -- the unpickler --

def _refusing(opcode):
    def refuse(self):
        raise _Refused(f"its pickle uses the opcode {opcode}, which torch.save never writes")
    return refuse


class _Unpickler(pickle._Unpickler):
    """pickle's Python unpickler with the globals, calls, BUILDs and
    container operations restricted as the module docstring says."""
    dispatch = dict(pickle._Unpickler.dispatch)

    def __init__(self, file, archive: _Archive):
        super().__init__(file, encoding="utf-8")  # as torch.load: Python 2 strings as UTF-8
        self._archive = archive
        self._named = {}  # id(object) -> _Entry, of every global this pickle named
        self._fresh = {}  # id(object) -> (object, BUILD kind, call arguments): made here, BUILD not yet applied
        self._sealed = {}  # id(dtype) -> dtype: given to numpy (an array, a scalar): its state may not change
        self._storages = {}  # key -> bytes of data/<key>
        self._typed = {}  # (key, dtype) -> storage

    def find_class(self, module, name):
        if self.proto < 3 and self.fix_imports:  # Python 2 names, as pickle maps them
            if (module, name) in _compat_pickle.NAME_MAPPING:
                module, name = _compat_pickle.NAME_MAPPING[(module, name)]
            elif module in _compat_pickle.IMPORT_MAPPING:
                module = _compat_pickle.IMPORT_MAPPING[module]
        full = f"{module}.{name}"
        entry = _lookup(full)
        if entry is None:
            raise _Refused(f"its pickle names the global '{full}', which is not on the allow-list", full)
        self._named[id(entry.obj)] = entry
        return entry.obj

    def persistent_load(self, pid):
        tag = pid[0] if type(pid) is tuple and len(pid) == 5 else None
        if type(tag) not in (str, bytes) or tag not in ("storage", b"storage"):
            raise _Refused("its pickle has a persistent id that is not a storage of the archive")
        _, kind, key, _location, numel = pid  # the location is ignored: everything loads on the CPU
        if not isinstance(kind, _StorageType) or type(key) is not str or type(numel) is not int or numel < 0:
            raise _Refused("its pickle has a malformed storage id")
        typed = self._typed.get((key, kind.dtype))
        if typed is None:
            data = self._storages.get(key)
            if data is None:
                data = self._storages[key] = self._archive.read(f"data/{key}")
            nbytes = numel * torch.empty((), dtype=kind.dtype).element_size()
            if len(data) != nbytes:
                raise ValueError(f"storage '{key}' holds {len(data)} bytes, but its id says {numel} elements of "
                                 f"{kind.dtype} ({nbytes} bytes)")
            typed = self._typed[(key, kind.dtype)] = _dcp.typed_storage(data, kind.dtype)
        return typed

    def _callable(self, func, newobj=False) -> _Entry:
        """The entry of FUNC, a global this pickle named that REDUCE (or
        NEWOBJ) may call; anything else on the stack is never called."""
        entry = self._named.get(id(func))
        if entry is None or entry.obj is not func:
            raise _Refused(f"its pickle calls {_describe(func)}, which is no global it named")
        if not (entry.newobj if newobj else entry.call is not None):
            raise _Refused(f"its pickle calls {_describe(func)}, which may be named, not called")
        return entry

    def _made(self, entry, value, args):
        if entry.fresh is not None:
            self._fresh[id(value)] = (value, entry.fresh, args)

    def _seal(self, values):
        for v in values:
            if isinstance(v, np.dtype):
                self._sealed[id(v)] = v

    def load_reduce(self):
        args = self.stack.pop()
        func = self.stack[-1]
        entry = self._callable(func)
        if type(args) is not tuple:
            raise pickle.UnpicklingError("REDUCE arguments are not a tuple")
        self._seal(args)
        value = entry.call(*args)
        self._made(entry, value, args)
        self.stack[-1] = value
    dispatch[pickle.REDUCE[0]] = load_reduce

    def _new_object(self, cls, args, kwargs):
        entry = self._callable(cls, newobj=True)
        if args or kwargs:
            raise _Refused(f"its pickle makes a {_describe(cls)} with arguments to __new__")
        value = cls.__new__(cls)
        self._made(entry, value, ())
        self.append(value)

    def load_newobj(self):
        args = self.stack.pop()
        cls = self.stack.pop()
        self._new_object(cls, args, None)
    dispatch[pickle.NEWOBJ[0]] = load_newobj

    def load_newobj_ex(self):
        kwargs = self.stack.pop()
        args = self.stack.pop()
        cls = self.stack.pop()
        self._new_object(cls, args, kwargs)
    dispatch[pickle.NEWOBJ_EX[0]] = load_newobj_ex

    def load_build(self):
        state = self.stack.pop()
        inst = self.stack[-1]
        made = self._fresh.pop(id(inst), None)
        if made is None or made[0] is not inst:
            raise _Refused(f"its pickle sets the state of {_describe(inst)}, which it did not just make (or set "
                           "once already)")
        _, kind, args = made
        if kind == "attrs":
            _set_attributes(inst, state)
        elif kind == "bytesio":
            if type(state) is not tuple or len(state) != 3 or type(state[0]) is not bytes or type(state[1]) is not int:
                raise _Refused("its pickle sets the state of a BytesIO from other than (bytes, position, dict)")
            inst.__setstate__((state[0], state[1], None))
            _set_attributes(inst, state[2])
        elif kind == "dtype":
            self._build_dtype(inst, state, args)
        else:
            self._build_array(inst, state)
    dispatch[pickle.BUILD[0]] = load_build

    def _build_dtype(self, inst, state, args):
        """A numpy dtype's state sets its byte order, size, alignment and
        flags, and numpy believes them: flags without "holds objects" on an
        object dtype would let an array's bytes be taken for object
        pointers. The state is tried on a copy made the same way, and
        applied only if the result is exactly what numpy makes of the dtype
        by itself; and only before an array or scalar has used the dtype."""
        if id(inst) in self._sealed:
            raise _Refused("its pickle changes a numpy dtype that an array or scalar already uses")
        _check_dtype_state(state)  # numpy's own __setstate__ crashes on some malformed tuples
        trial = _np_dtype(*args)
        trial.__setstate__(state)
        if trial.fields is not None or trial.subdtype is not None or trial.names is not None:
            raise _Refused(f"its pickle holds the structured numpy dtype {trial}, which the restricted unpickler "
                           "does not rebuild")
        if trial.metadata:
            raise _Refused("its pickle holds a numpy dtype with metadata")
        try:
            reference = np.dtype(trial.str)
        except TypeError:
            reference = None
        if reference is None or reference.__reduce__() != trial.__reduce__():
            raise _Refused(f"its pickle sets the state of a numpy dtype {trial.str} to something numpy itself does "
                           "not make (flags, size or alignment)")
        inst.__setstate__(state)

    def _build_array(self, inst, state):
        """ndarray.__setstate__ with the checks numpy leaves out: a list of
        objects as long as the array (a shorter one crashes numpy), bytes
        exactly as many as it holds."""
        if type(state) is not tuple or len(state) not in (4, 5) \
                or (len(state) == 5 and (type(state[0]) is not int or state[0] != 1)):
            raise _Refused("its pickle sets the state of a numpy array from other than numpy's 5-tuple")
        shape, dtype, fortran, data = state[-4:]
        if not isinstance(dtype, np.dtype):
            raise _Refused("its pickle gives a numpy array a dtype that is not a dtype")
        self._seal((dtype,))
        if type(shape) is not tuple or not all(type(n) is int and n >= 0 for n in shape) or type(fortran) is not bool:
            raise _Refused("its pickle gives a numpy array a malformed shape")
        count = 1
        for n in shape:
            count *= n
        if dtype.hasobject:
            if dtype.char != "O" or type(data) is not list or len(data) != count:
                raise _Refused(f"its pickle gives a numpy array of {count} objects other than a list of {count}")
        else:
            if type(data) is not bytes or len(data) != count * dtype.itemsize:
                raise _Refused(f"its pickle gives a numpy array of {count} x {dtype.itemsize} bytes other than as "
                               "many bytes")
            if dtype.itemsize == 0 and count:
                raise _Refused("its pickle makes a numpy array of zero-size items")
        inst.__setstate__(state)

    # Containers: only the real list, deque, dict and set operations (pickle's
    # own would call an `append`, `extend` or `add` the object has).
    def _target(self, kinds, op):
        target = self.stack[-1]
        if type(target) not in kinds:
            raise _Refused(f"its pickle applies {op} to {_describe(target)}")
        return target

    def load_append(self):
        value = self.stack.pop()
        self._target((list, collections.deque), "APPEND").append(value)
    dispatch[pickle.APPEND[0]] = load_append

    def load_appends(self):
        items = self.pop_mark()
        self._target((list, collections.deque), "APPENDS").extend(items)
    dispatch[pickle.APPENDS[0]] = load_appends

    def load_setitem(self):
        value = self.stack.pop()
        key = self.stack.pop()
        self._target(_DICTS, "SETITEM")[key] = value
    dispatch[pickle.SETITEM[0]] = load_setitem

    def load_setitems(self):
        items = self.pop_mark()
        target = self._target(_DICTS, "SETITEMS")
        for i in range(0, len(items), 2):
            target[items[i]] = items[i + 1]
    dispatch[pickle.SETITEMS[0]] = load_setitems

    def load_additems(self):
        items = self.pop_mark()
        self._target((set,), "ADDITEMS").update(items)
    dispatch[pickle.ADDITEMS[0]] = load_additems

    for _op, _name in ((pickle.INST, "INST"), (pickle.OBJ, "OBJ"), (pickle.EXT1, "EXT1"), (pickle.EXT2, "EXT2"),
                       (pickle.EXT4, "EXT4")):
        dispatch[_op[0]] = _refusing(_name)
    del _op, _name
