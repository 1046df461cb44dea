"""Objects are untrusted input (docs/PYTHON.md): a checkpoint's pickled
objects are rebuilt by a restricted unpickler, so a crafted object runs no
code in the reading process, and the writer never unpickles what it stores.
Malicious checkpoints are written through the package's own writer (DCP
pickles the value with torch.save, which runs nothing) or crafted byte by
byte; nothing here loads them without restriction, except the trusted-path
test, whose object only records that it was unpickled.

    PYTHONPATH=<build>/python /usr/bin/python3 -m unittest discover -s python/tests
"""
import argparse
import collections
import datetime
import io
import os
import pathlib
import random
import shutil
import struct
import tempfile
import unittest
import zipfile
from unittest import mock

import numpy as np
import torch

import distckpt
from distckpt import _dcp, _objects
from distckpt._storage import Checkpoint

UNPICKLED = []  # what Recorder's pickle did, when (and only when) something unpickled it


class RunsCommand:
    """Pickles as os.system(COMMAND): what a malicious checkpoint holds."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def record(tag):
    UNPICKLED.append(tag)
    return Recorded(tag)


class Recorded:
    def __init__(self, tag):
        self.tag = tag


class Recorder:
    """A harmless object off the allow-list: unpickling it calls record()."""

    def __init__(self, tag):
        self.tag = tag

    def __reduce__(self):
        return record, (self.tag,)


def save(sd, path, planner=None):
    _dcp.save(sd, storage_writer=distckpt.FileSystemWriter(path), no_dist=True, planner=planner)


def load(sd, path, **kw):
    _dcp.load(sd, storage_reader=distckpt.FileSystemReader(path, **kw), no_dist=True)
    return sd


def read_directly(path, keys, **kw):
    """The reader driven by hand (as test_bridge's torch 2 sequence), so its
    own exception comes out rather than DCP 1.13's CheckpointException."""
    reader = distckpt.FileSystemReader(path, **kw)
    md = reader.read_metadata()
    reader.init(md, True)
    got = {k: None for k in keys}
    planner = _dcp.dcp.default_planner.DefaultLoadPlanner()
    planner.init(got, md, True)
    plan = reader.prepare_global_plan([reader.prepare_local_plan(planner.create_local_plan())])[0]
    reader.read_data(planner.finish_plan(plan), planner).wait()
    return got


class CraftingPlanner(_dcp.dcp.default_planner.DefaultSavePlanner):
    """Stores the given bytes for some keys instead of torch.save of the value."""

    def __init__(self, crafted):
        super().__init__()
        self.crafted = crafted

    def transform_object(self, write_item, obj):
        if write_item.index.fqn in self.crafted:
            return io.BytesIO(self.crafted[write_item.index.fqn])
        return super().transform_object(write_item, obj)


# -- pickles written by hand (protocol 2 opcodes) --

def g(module, name):
    return b"c" + f"{module}\n{name}\n".encode()


def u(text):
    raw = text.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw


def i(n):
    return b"J" + struct.pack("<i", n)


def b(data):  # bytes as protocol 2 writes them
    return g("_codecs", "encode") + u(data.decode("latin-1")) + u("latin1") + b"\x86R"


MARK, TUPLE, REDUCE, BUILD, STOP, NONE, TRUE, FALSE = b"(", b"t", b"R", b"b", b".", b"N", b"\x88", b"\x89"


def put(n):
    return b"q" + bytes([n])


def get(n):
    return b"h" + bytes([n])


def archive(pkl, records=None):
    """PKL (and data/KEY records) as a torch.save zip archive."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", b"\x80\x02" + pkl + STOP)
        for key, data in (records or {}).items():
            z.writestr(f"archive/data/{key}", data)
    return out.getvalue()


def np_dtype(spec):
    return g("numpy", "dtype") + u(spec) + FALSE + TRUE + b"\x87R"


def np_state(flags, elsize=-1, order="|"):
    return MARK + i(3) + u(order) + NONE + NONE + NONE + i(elsize) + i(-1) + i(flags) + TUPLE


def empty_array():
    return g("numpy.core.multiarray", "_reconstruct") + g("numpy", "ndarray") + i(0) + b"\x85" + b(b"b") + b"\x87R"


class UntrustedObjects(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="distckpt-untrusted-")
        self.ckpt = os.path.join(self.tmp, "ckpt")
        UNPICKLED.clear()

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def refused(self, raw, *texts):
        with self.assertRaises(distckpt.UntrustedObjectError) as caught:
            _objects.decode(raw, "crafted", self.ckpt)
        for text in texts:
            self.assertIn(text, str(caught.exception))
        return caught.exception

    def test_code_in_an_object_runs_neither_on_save_nor_on_read(self):
        pwned = os.path.join(self.tmp, "pwned")
        save({"w": torch.ones(2), "evil": RunsCommand(f"touch {pwned}")}, self.ckpt)
        self.assertFalse(os.path.exists(pwned), "the save ran the object's pickle")
        self.assertEqual(distckpt.inspect(self.ckpt)["objects"], ["evil/shard_0_1"])
        system = f"{os.system.__module__}.system"  # posix.system
        with self.assertRaises(BaseException) as caught:  # DCP 1.13 wraps it in its CheckpointException
            load({"w": torch.zeros(2), "evil": None}, self.ckpt)
        for text in ("object 'evil'", f"'{system}'", "trust_objects=True"):
            self.assertIn(text, str(caught.exception))
        with self.assertRaises(distckpt.UntrustedObjectError) as caught:
            read_directly(self.ckpt, ["evil"])
        self.assertEqual((caught.exception.key, caught.exception.global_name), ("evil", system))
        self.assertIsInstance(caught.exception, distckpt.CheckpointError)
        self.assertFalse(os.path.exists(pwned), "the read ran the object's pickle")
        # The tensors of the checkpoint load whatever its objects hold.
        self.assertTrue(torch.equal(load({"w": torch.zeros(2)}, self.ckpt)["w"], torch.ones(2)))

    def test_objects_off_the_allow_list_load_only_with_trust(self):
        save({"hook": Recorder("loaded")}, self.ckpt)
        self.assertEqual(UNPICKLED, [], "the save unpickled the object")
        with self.assertRaises(distckpt.UntrustedObjectError) as caught:
            read_directly(self.ckpt, ["hook"])
        self.assertEqual(caught.exception.global_name, f"{__name__}.record")
        self.assertEqual(UNPICKLED, [])
        # The opt-in restores torch.load: the pickle runs (here: record()).
        got = load({"hook": None}, self.ckpt, trust_objects=True)
        self.assertIsInstance(got["hook"], Recorded)
        self.assertEqual(UNPICKLED, ["loaded"])

    def test_the_writer_never_calls_torch_load(self):
        sd = {"step": 3, "opt": {"lr": 0.5, "m": torch.arange(3.0)}, "hook": Recorder("saved"), "ids": {1, 2}}
        with mock.patch.object(torch, "load", side_effect=AssertionError("torch.load at save time")):
            save(sd, self.ckpt)
        self.assertEqual(UNPICKLED, [])
        self.assertEqual(distckpt.inspect(self.ckpt)["objects"], ["hook/shard_0_1", "ids/shard_0_1"])

    def test_plain_values_keep_their_form_on_disk(self):
        sd = {"step": 7, "lr": 0.5, "name": "gpt", "none": None, "flag": True, "np_float": np.float64(0.25),
              "nested": {"a": [1, (2, 3)], "t": torch.arange(4, dtype=torch.int32), "size": torch.Size([2, 3])},
              "w": torch.ones(2)}
        save(sd, self.ckpt)
        self.assertEqual(distckpt.inspect(self.ckpt)["objects"], [])
        with Checkpoint(self.ckpt) as ckpt:
            common = ckpt.common_state()
        t = common["nested"].pop("t")
        self.assertTrue(torch.equal(t, torch.arange(4, dtype=torch.int32)))
        self.assertEqual(common, {"step": 7, "lr": 0.5, "name": "gpt", "none": None, "flag": True, "np_float": 0.25,
                                  "nested": {"a": [1, [2, 3]], "size": [2, 3]}})

    def test_what_checkpoints_hold_loads_without_opting_in(self):
        objects = {
            "args": argparse.Namespace(lr=0.1, params_dtype=torch.bfloat16, save=pathlib.PosixPath("/ckpt"),
                                       seq=[1, 2]),
            "rng": {"random": random.getstate(), "np": np.random.get_state(), "torch": torch.get_rng_state()},
            "array": np.arange(6, dtype=np.float32).reshape(2, 3),
            "ordered": collections.OrderedDict([(1, "one"), (2, "two")]),
            "tensors": {"t": torch.arange(4.0), "half": torch.ones(2, dtype=torch.bfloat16), "ids": {1, 2}},
            "size": {"shape": torch.Size([2, 3]), "kinds": frozenset(["a"])},
            "extra_state": io.BytesIO(b"transformer engine"),
            "misc": [b"raw", 1 + 2j, slice(1, 3), collections.deque([1], 4), collections.defaultdict(list, {1: [2]}),
                     np.int64(5), np.dtype("<U3"), np.array(["ab", None], dtype=object),
                     datetime.datetime(2020, 1, 2, tzinfo=datetime.timezone.utc)],
            "param": {"p": torch.nn.Parameter(torch.ones(3)), "device": torch.device("cpu"), "x": {0.5}},
        }
        save(objects, self.ckpt)
        self.assertEqual(distckpt.inspect(self.ckpt)["objects"], sorted(f"{k}/shard_0_1" for k in objects))
        got = load({k: None for k in objects}, self.ckpt)
        self.assertEqual(vars(got["args"]), vars(objects["args"]))
        self.assertEqual(got["rng"]["random"], objects["rng"]["random"])
        self.assertEqual(got["rng"]["np"][0], "MT19937")
        self.assertTrue(np.array_equal(got["rng"]["np"][1], objects["rng"]["np"][1]))
        self.assertEqual(got["rng"]["np"][2:], objects["rng"]["np"][2:])
        self.assertTrue(torch.equal(got["rng"]["torch"], objects["rng"]["torch"]))
        np.random.set_state(got["rng"]["np"])  # usable as an RNG state
        self.assertTrue(np.array_equal(got["array"], objects["array"]))
        self.assertEqual(got["array"].dtype, np.float32)
        self.assertIsInstance(got["ordered"], collections.OrderedDict)
        self.assertEqual(got["ordered"], objects["ordered"])
        self.assertTrue(torch.equal(got["tensors"]["t"], torch.arange(4.0)))
        self.assertEqual(got["tensors"]["half"].dtype, torch.bfloat16)
        self.assertEqual(got["tensors"]["ids"], {1, 2})
        self.assertIsInstance(got["size"]["shape"], torch.Size)
        self.assertEqual(got["size"], objects["size"])
        self.assertEqual(got["extra_state"].getvalue(), b"transformer engine")
        misc = got["misc"]
        self.assertEqual(misc[:3] + [list(misc[3]), dict(misc[4])], [b"raw", 1 + 2j, slice(1, 3), [1], {1: [2]}])
        self.assertEqual((misc[3].maxlen, misc[4].default_factory), (4, list))
        self.assertEqual((misc[5], type(misc[5])), (5, np.int64))
        self.assertEqual(misc[6], np.dtype("<U3"))
        self.assertEqual(misc[7].tolist(), ["ab", None])
        self.assertEqual(misc[8], objects["misc"][8])
        self.assertIsInstance(got["param"]["p"], torch.nn.Parameter)
        self.assertTrue(torch.equal(got["param"]["p"], torch.ones(3)))
        self.assertEqual(got["param"]["device"], torch.device("cpu"))

    def test_every_pickle_protocol_torch_save_writes_decodes(self):
        value = {"args": argparse.Namespace(a=np.arange(6.0).reshape(2, 3), b=b"xy"), "t": torch.arange(3),
                 "f": np.asfortranarray(np.ones((2, 2), dtype=np.int16)), "o": collections.OrderedDict(x={1})}
        for protocol in (2, 3, 4, 5):
            with self.subTest(protocol=protocol):
                raw = io.BytesIO()
                torch.save(value, raw, pickle_protocol=protocol)
                got = _objects.decode(raw.getvalue(), "v", self.ckpt)
                self.assertTrue(np.array_equal(got["args"].a, value["args"].a))
                self.assertEqual(got["args"].b, b"xy")
                self.assertTrue(torch.equal(got["t"], value["t"]))
                self.assertTrue(np.array_equal(got["f"], value["f"]) and got["f"].flags.f_contiguous)
                self.assertEqual(got["o"], value["o"])

    def test_a_crafted_object_is_refused_through_the_reader(self):
        # An object array over a dtype whose pickled flags say "no objects":
        # numpy would take the 8 bytes for an object pointer.
        forged = empty_array() + MARK + i(1) + i(1) + b"\x85" + np_dtype("O8") + np_state(0) + BUILD + FALSE \
            + b(b"\x41" * 8) + TUPLE + BUILD
        save({"obj": {1}}, self.ckpt, planner=CraftingPlanner({"obj": archive(forged)}))
        with self.assertRaises(distckpt.UntrustedObjectError) as caught:
            read_directly(self.ckpt, ["obj"])
        self.assertIn("numpy itself does not make", str(caught.exception))

    def test_crafted_pickles_are_refused_before_anything_runs(self):
        pwned = os.path.join(self.tmp, "pwned")
        e = self.refused(archive(g("posix", "system") + u(f"touch {pwned}") + b"\x85" + REDUCE), "'posix.system'")
        self.assertEqual(e.global_name, "posix.system")
        # Protocol 4's STACK_GLOBAL goes through the same allow-list.
        self.refused(archive(u("builtins") + u("eval") + b"\x93" + u("1") + b"\x85" + REDUCE), "'builtins.eval'")
        self.assertFalse(os.path.exists(pwned))
        # BUILD on a class (setattr(argparse.Namespace, '__init__', ...)), never on what it did not just make.
        init = argparse.Namespace.__init__
        self.refused(archive(g("argparse", "Namespace") + NONE + b"}" + u("__init__") + NONE + b"s" + b"\x86"
                             + BUILD), "sets the state of argparse.Namespace")
        self.assertIs(argparse.Namespace.__init__, init)
        # Nor an attribute the class defines on an object it made.
        self.refused(archive(g("argparse", "Namespace") + b")\x81" + b"}" + u("_get_kwargs") + NONE + b"s" + BUILD),
                     "'_get_kwargs'")
        # Classes that are values only are never called.
        self.refused(archive(g("torch", "Tensor") + i(10) + b"\x85" + REDUCE), "may be named, not called")
        # Opcodes torch.save never writes (EXT1 reads copyreg's shared cache).
        self.refused(archive(b"\x82\x01"), "opcode EXT1")
        # APPEND only reaches lists and deques.
        self.refused(archive(g("argparse", "Namespace") + b")\x81" + i(1) + b"a"), "APPEND")

    def test_numpy_states_numpy_itself_would_trust_are_checked(self):
        # A list of objects shorter than the array: numpy reads past it.
        self.refused(archive(empty_array() + MARK + i(1) + i(5) + b"\x85" + np_dtype("O8") + FALSE + b"]" + i(1)
                             + b"a" + TUPLE + BUILD), "other than a list of 5")
        # A dtype changed after an array uses it (elsize 8 -> 1000: reads past the array).
        sealed = np_dtype("V8") + put(0) + b"0" + empty_array() + MARK + i(1) + i(1) + b"\x85" + get(0) + FALSE \
            + b(b"\x00" * 8) + TUPLE + BUILD + b"0" + get(0) + np_state(0, elsize=1000) + BUILD
        self.refused(archive(sealed), "already uses")
        # A dtype state of another shape than numpy writes: numpy's own __setstate__ crashes on this one.
        self.refused(archive(np_dtype("f8") + MARK + i(3) + u("<") + NONE + i(-1) + i(-1) + i(0) + TUPLE + BUILD),
                     "the state numpy writes")
        # numpy's _reconstruct only as numpy writes it (no other shape: no huge allocation).
        self.refused(archive(g("numpy.core.multiarray", "_reconstruct") + g("numpy", "ndarray") + i(1 << 30)
                             + b"\x85" + b(b"b") + b"\x87R"), "_reconstruct")

    def test_tensors_come_only_from_the_archive_storages(self):
        def tensor(numel, hooks=g("collections", "OrderedDict") + b")R"):
            return g("torch._utils", "_rebuild_tensor_v2") + MARK + MARK + u("storage") + g("torch", "FloatStorage") \
                + u("0") + u("cpu") + i(numel) + TUPLE + b"Q" + i(0) + i(numel) + b"\x85" + i(1) + b"\x85" + FALSE \
                + hooks + TUPLE + REDUCE

        data = struct.pack("<4f", 1, 2, 3, 4)
        got = _objects.decode(archive(tensor(4), {"0": data}), "t", self.ckpt)
        self.assertTrue(torch.equal(got, torch.tensor([1.0, 2, 3, 4])))
        with self.assertRaisesRegex(distckpt.CorruptionError, "holds 16 bytes, but its id says 1000 elements"):
            _objects.decode(archive(tensor(1000), {"0": data}), "t", self.ckpt)
        self.refused(archive(tensor(4, hooks=b"}" + u("h") + g("builtins", "set") + b"s"), {"0": data}),
                     "backward hooks")


if __name__ == "__main__":
    unittest.main()
