"""The Python bridge in one process (DCP's no_dist mode): values round-trip
through the writer and reader, damage is reported with the key and file, the
writer never loses a committed checkpoint, untrusted paths are refused.
Multi-process cases against the C++ runtime are in tests/e2e/python_bridge_test.cpp.

    PYTHONPATH=<build>/python /usr/bin/python3 -m unittest discover -s python/tests
"""
import itertools
import json
import math
import os
import shutil
import tempfile
import unittest
import warnings
from unittest import mock

import flatbuffers
import torch

import distckpt
from distckpt import _common, _dcp, _format, _index, _reader, _storage
from distckpt.fb import CommonState, Node
from distckpt.fb.NodeKind import NodeKind


class Opaque:
    """A value common.fb cannot hold: stored as a pickled object. A class of
    this module is off the restricted unpickler's allow-list: reading it back
    takes FileSystemReader(trust_objects=True) (test_untrusted_objects.py)."""

    def __init__(self, x):
        self.x = x

    def __eq__(self, other):
        return isinstance(other, Opaque) and other.x == self.x


def state():
    g = torch.Generator().manual_seed(7)
    return {
        "w": torch.randn(6, 5, generator=g),
        "half": torch.randn(4, 3, generator=g).to(torch.bfloat16),
        "mask": torch.rand(7, generator=g) > 0.5,
        "ids": torch.arange(10, dtype=torch.int64).reshape(2, 5),
        "scalar": torch.tensor(3.5),
        "step": 42,
        "lr": 0.125,
        "name": "gpt",
        "optimizer": {"param_groups": [{"lr": 0.1, "betas": (0.9, 0.95), "params": [0, 1]}],
                      "scale": torch.tensor([2.0, 4.0])},
        "rng": Opaque(5),
        "nothing": None,
    }


def empty_like(sd):
    out = {}
    for k, v in sd.items():
        out[k] = torch.zeros_like(v) if isinstance(v, torch.Tensor) else None
    return out


def save(sd, path, **kw):
    _dcp.save(sd, storage_writer=distckpt.FileSystemWriter(path, **kw), no_dist=True)


def load(sd, path, **kw):
    _dcp.load(sd, storage_reader=distckpt.FileSystemReader(path, **kw), no_dist=True)
    return sd


def flip(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x20]))


class Bridge(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="distckpt-py-")
        self.ckpt = os.path.join(self.tmp, "ckpt")

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def test_values_round_trip(self):
        sd = state()
        save(sd, self.ckpt)
        got = load(empty_like(sd), self.ckpt, trust_objects=True)  # "rng" is an Opaque
        for k, v in sd.items():
            if isinstance(v, torch.Tensor):
                self.assertTrue(torch.equal(got[k], v), k)
                self.assertEqual(got[k].dtype, v.dtype)
        self.assertEqual(got["step"], 42)
        self.assertEqual(got["lr"], 0.125)
        self.assertEqual(got["name"], "gpt")
        self.assertIsNone(got["nothing"])
        self.assertEqual(got["rng"], Opaque(5))
        # tuples come back as lists (common.fb has lists, as JSON)
        self.assertEqual(got["optimizer"]["param_groups"], [{"lr": 0.1, "betas": [0.9, 0.95], "params": [0, 1]}])
        self.assertTrue(torch.equal(got["optimizer"]["scale"], torch.tensor([2.0, 4.0])))

    def test_inspect_verify_and_plain_tensors(self):
        sd = state()
        save(sd, self.ckpt)
        info = distckpt.inspect(self.ckpt)
        self.assertEqual(info["world_size"], 1)
        self.assertEqual(sorted(info["tensors"]), ["half", "ids", "mask", "scalar", "w"])
        self.assertEqual(info["objects"], ["rng/shard_0_1"])
        self.assertIn("optimizer", info["common"])
        report = distckpt.verify(self.ckpt)
        self.assertTrue(report.intact, report.problems)
        plain = distckpt.load_plain_tensors(self.ckpt, keys=["w", "scalar"])
        self.assertEqual(sorted(plain), ["scalar", "w"])
        self.assertTrue(torch.equal(plain["w"], sd["w"]))
        self.assertTrue(torch.equal(plain["scalar"], sd["scalar"]))
        with self.assertRaisesRegex(distckpt.CheckpointError, "has no tensor 'nope'"):
            distckpt.load_plain_tensors(self.ckpt, keys=["nope"])

    def test_a_dtype_this_torch_lacks_is_listed_verified_and_left_out(self):
        # What a newer writer produces: "mask" (1 byte per element) under a
        # dtype name this build does not know, with its element size.
        sd = state()
        save(sd, self.ckpt)
        marker = _format.load_commit_marker(self.ckpt)
        with open(os.path.join(self.ckpt, marker.metadata.path), "rb") as f:
            m = _format.decode_metadata(f.read(), "metadata")
        for t in m.tensors:
            if t.key == "mask":
                t.dtype, t.element_size = "float4_e2m1fn_x2", 1
        raw = _format.encode_metadata(m)
        _format.write_file_atomic(os.path.join(self.ckpt, "metadata-newer.fb"), raw)
        with open(os.path.join(self.ckpt, marker.common.path), "rb") as f:
            common = f.read()
        text = _format.commit_marker_text(
            1, _format.RecordedFile("metadata-newer.fb", len(raw), _format.xxh3(raw)),
            _format.RecordedFile(marker.common.path, len(common), _format.xxh3(common)), "a newer distckpt")
        _format.write_file_atomic(os.path.join(self.ckpt, _format.COMMIT_FILE), text)

        self.assertEqual(distckpt.inspect(self.ckpt)["tensors"]["mask"]["dtype"], "float4_e2m1fn_x2")
        self.assertTrue(distckpt.verify(self.ckpt).intact)
        with self.assertRaisesRegex(distckpt.CheckpointError, "'mask' in .* cannot be loaded: float4_e2m1fn_x2 is a "
                                    "dtype this version of distckpt does not know"):
            distckpt.load_plain_tensors(self.ckpt)
        self.assertTrue(torch.equal(distckpt.load_plain_tensors(self.ckpt, keys=["w"])["w"], sd["w"]))
        # Through DCP the other entries load; mask is left out with a warning.
        wanted = empty_like(sd)
        del wanted["mask"]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = load(wanted, self.ckpt, trust_objects=True)  # "rng" is an Opaque
        self.assertTrue(torch.equal(got["w"], sd["w"]))
        self.assertTrue(any("'mask' left out" in str(w.message) for w in caught), [str(w.message) for w in caught])

    def test_content_metadata_is_saved_and_read_alone(self):
        content = {"distrib_optim_sharding_type": "fully_sharded_model_space", "format": {"version": 2}}
        save(state(), self.ckpt, content_metadata=content)
        self.assertEqual(distckpt.load_content_metadata(self.ckpt), content)
        self.assertNotIn("distrib_optim_sharding_type", distckpt.inspect(self.ckpt)["common"])
        other = os.path.join(self.tmp, "plain")
        save(state(), other)
        self.assertIsNone(distckpt.load_content_metadata(other))
        with self.assertRaisesRegex(ValueError, "content_metadata must be a dict, not a list"):
            distckpt.FileSystemWriter(other, content_metadata=[1])

    def test_negative_zero_keeps_its_sign(self):
        save({"w": torch.ones(1), "neg": -0.0, "pos": 0.0}, self.ckpt)
        got = load({"w": torch.zeros(1), "neg": None, "pos": None}, self.ckpt)
        self.assertEqual(math.copysign(1.0, got["neg"]), -1.0)
        self.assertEqual(math.copysign(1.0, got["pos"]), 1.0)

    def test_common_paths_are_dcp_entries(self):
        save(state(), self.ckpt)
        md = distckpt.FileSystemReader(self.ckpt).read_metadata().state_dict_metadata
        self.assertIsInstance(md["optimizer.param_groups.0.lr"], _dcp.BytesStorageMetadata)
        self.assertIsInstance(md["optimizer.scale"], _dcp.TensorStorageMetadata)
        got = load({"optimizer.param_groups.0.lr": None, "optimizer.scale": torch.zeros(2)}, self.ckpt)
        self.assertEqual(got["optimizer.param_groups.0.lr"], 0.1)
        self.assertTrue(torch.equal(got["optimizer.scale"], torch.tensor([2.0, 4.0])))

    def test_flipped_data_byte_names_key_and_file(self):
        save({"w": torch.arange(64.0)}, self.ckpt)
        flip(os.path.join(self.ckpt, "data/rank_00000.bin"), 17)
        with self.assertRaises(BaseException) as e:
            load({"w": torch.zeros(64)}, self.ckpt)
        text = str(e.exception)
        self.assertIn("checksum mismatch", text)
        self.assertIn("tensor 'w'", text)
        self.assertIn("rank_00000.bin", text)
        report = distckpt.verify(self.ckpt)
        self.assertFalse(report.intact)
        self.assertIn("tensor 'w' chunk 0", report.problems[0])

    def test_flipped_metadata_byte_is_refused(self):
        save({"w": torch.arange(8.0)}, self.ckpt)
        flip(os.path.join(self.ckpt, "metadata.fb"), 40)
        with self.assertRaisesRegex(distckpt.CorruptionError, r"checksum mismatch in .*metadata\.fb"):
            distckpt.FileSystemReader(self.ckpt).read_metadata()

    def test_flipped_common_byte_is_refused(self):
        save({"step": 3, "w": torch.ones(2)}, self.ckpt)
        flip(os.path.join(self.ckpt, "common.fb"), 30)
        with self.assertRaisesRegex(distckpt.CorruptionError, r"checksum mismatch in .*common\.fb"):
            distckpt.FileSystemReader(self.ckpt).read_metadata()

    def test_damaged_commit_marker_is_refused(self):
        save({"w": torch.ones(2)}, self.ckpt)
        marker = os.path.join(self.ckpt, "metadata.json")
        with open(marker) as f:
            text = f.read()
        with open(marker, "w") as f:
            f.write(text.replace('"world_size"', '"world_sise"'))
        with self.assertRaisesRegex(distckpt.CorruptionError, "commit marker is damaged"):
            distckpt.inspect(self.ckpt)

    def edit_marker(self, version, common=None, **head):
        """The marker the writer wrote, rewritten with VERSION and HEAD's
        fields in its "metadata" entry (COMMON's in its "common" entry)."""
        path = os.path.join(self.ckpt, _format.COMMIT_FILE)
        if not hasattr(self, "written_marker"):
            with open(path) as f:
                self.written_marker = f.read()
        doc = json.loads(self.written_marker)
        doc["version"] = version
        doc["metadata"].update(head)
        doc["common"].update(common or {})
        with open(path, "w") as f:
            json.dump(doc, f, indent=2)

    def v3_head(self, size):
        """The head fields of metadata.fb's first SIZE bytes, and its size."""
        with open(os.path.join(self.ckpt, "metadata.fb"), "rb") as f:
            raw = f.read()
        return {"head_bytes": size, "head_xxh3": f"{_format.xxh3(raw[:size]):016x}"}, len(raw)

    def test_a_version_3_marker_checks_the_head_of_metadata(self):
        # Only the marker is version 3 (metadata.fb still says 2): the reader
        # takes each file's version as it finds it.
        save({"w": torch.arange(8.0), "step": 1}, self.ckpt)
        _, size = self.v3_head(0)
        for head_size in (0, size // 2, size):
            self.edit_marker(3, **self.v3_head(head_size)[0])
            self.assertEqual(distckpt.inspect(self.ckpt)["format_version"], 3)
            self.assertTrue(distckpt.verify(self.ckpt).intact)
            self.assertTrue(torch.equal(load({"w": torch.zeros(8)}, self.ckpt)["w"], torch.arange(8.0)))
        head, _ = self.v3_head(size // 2)
        head["head_xxh3"] = f"{int(head['head_xxh3'], 16) ^ 1:016x}"
        self.edit_marker(3, **head)
        with self.assertRaisesRegex(distckpt.CorruptionError, rf"checksum mismatch in .*metadata\.fb: XXH3 [0-9a-f]+ "
                                    rf"of its first {size // 2} bytes but the commit marker"):
            distckpt.FileSystemReader(self.ckpt).read_metadata()
        self.assertEqual(distckpt.verify(self.ckpt).status, "corrupt")

    def test_a_version_3_marker_without_a_valid_head_is_damaged(self):
        save({"w": torch.ones(2)}, self.ckpt)
        head, size = self.v3_head(16)
        for edit, message in [
                ({"head_bytes": None}, 'field "metadata": field "head_bytes" is missing'),
                ({"head_xxh3": None}, 'field "metadata": field "head_xxh3" is missing'),
                ({"head_bytes": size + 1}, f'"head_bytes" {size + 1} is more than "bytes" {size}'),
                ({"head_bytes": -1}, '"head_bytes" is not a non-negative integer'),
                ({"head_bytes": "16"}, '"head_bytes" is not a non-negative integer'),
                ({"head_xxh3": head["head_xxh3"].upper()}, '"head_xxh3" must be 16 lowercase hex digits')]:
            with self.subTest(edit=edit):
                fields = {**head, **edit}
                self.edit_marker(3, **{k: v for k, v in fields.items() if v is not None})
                with self.assertRaisesRegex(distckpt.CorruptionError, message):
                    distckpt.inspect(self.ckpt)
                self.assertEqual(distckpt.verify(self.ckpt).status, "corrupt")

    def test_the_head_fields_are_version_3_and_metadata_only(self):
        save({"w": torch.ones(2)}, self.ckpt)
        head, _ = self.v3_head(16)
        self.edit_marker(2, **head)  # version 2 knows no head: the strict parse refuses it
        with self.assertRaisesRegex(distckpt.CorruptionError, 'field "metadata": unknown field "head_bytes"'):
            distckpt.inspect(self.ckpt)
        self.edit_marker(3, common=head, **head)
        with self.assertRaisesRegex(distckpt.CorruptionError, 'field "common": unknown field "head_bytes"'):
            distckpt.inspect(self.ckpt)
        self.edit_marker(4)
        with self.assertRaisesRegex(distckpt.CheckpointError, "version 4 is newer than this distckpt reads "
                                    r"\(version 3\)"):
            distckpt.inspect(self.ckpt)

    def test_the_writer_writes_version_2(self):
        save({"w": torch.ones(2), "step": 1}, self.ckpt)
        with open(os.path.join(self.ckpt, _format.COMMIT_FILE)) as f:
            doc = json.load(f)
        self.assertEqual(doc["version"], 2)
        self.assertEqual(sorted(doc["metadata"]), ["bytes", "file", "xxh3"])
        with open(os.path.join(self.ckpt, "metadata.fb"), "rb") as f:
            self.assertEqual(_format.decode_metadata(f.read(), "metadata.fb").format_version, 2)
        with open(os.path.join(self.ckpt, "common.fb"), "rb") as f:
            self.assertEqual(CommonState.CommonState.GetRootAs(f.read(), 0).FormatVersion(), 2)

    def test_buffers_of_version_3_are_read_and_of_4_refused(self):
        def buffers(version):  # metadata.fb and common.fb as a writer of VERSION writes them
            with mock.patch.object(_format, "WRITE_VERSION", version), \
                    mock.patch.object(_common, "WRITE_VERSION", version):
                return (_format.encode_metadata(_format.Metadata(1, 0, [], [], [], common_file="common.fb")),
                        _common.encode({"step": 1}))

        metadata, common = buffers(3)
        self.assertEqual(_format.decode_metadata(metadata, "metadata.fb").format_version, 3)
        self.assertEqual(_common.decode(common, "common.fb"), {"step": 1})
        metadata, common = buffers(4)
        newer = r"written by a newer distckpt \(version 4\); this reads version 3"
        with self.assertRaisesRegex(distckpt.CheckpointError, newer):
            _format.decode_metadata(metadata, "metadata.fb")
        with self.assertRaisesRegex(distckpt.CheckpointError, newer):
            _common.decode(common, "common.fb")

    def test_foreign_directory_says_who_wrote_it(self):
        os.makedirs(self.ckpt)
        with open(os.path.join(self.ckpt, "metadata.json"), "w") as f:
            f.write('{"sharded_backend": "torch_dist"}')
        with self.assertRaisesRegex(distckpt.CheckpointError, "written by 'torch_dist', not distckpt"):
            distckpt.inspect(self.ckpt)

    def test_other_formats_and_wrong_paths_say_what_they_are(self):
        with self.assertRaisesRegex(distckpt.CheckpointError, "the path does not exist"):
            distckpt.inspect(os.path.join(self.tmp, "nope"))
        pt = os.path.join(self.tmp, "model.pt")
        torch.save({"w": torch.ones(2)}, pt)
        with self.assertRaisesRegex(distckpt.CheckpointError, "reads distckpt checkpoints only; convert it first"):
            distckpt.inspect(pt)
        os.makedirs(self.ckpt)
        open(os.path.join(self.ckpt, "model.safetensors"), "wb").close()
        with self.assertRaisesRegex(distckpt.CheckpointError, "it holds safetensors files: the Python package"):
            distckpt.inspect(self.ckpt)
        with self.assertRaisesRegex(BaseException, "is a file; a checkpoint is a directory"):
            save({"w": torch.ones(3)}, pt)

    def test_committed_checkpoint_is_never_overwritten_by_accident(self):
        save({"w": torch.ones(3)}, self.ckpt)
        with self.assertRaisesRegex(BaseException, "already holds a committed checkpoint; pass overwrite=True"):
            save({"w": torch.zeros(3)}, self.ckpt)
        self.assertTrue(torch.equal(distckpt.load_plain_tensors(self.ckpt)["w"], torch.ones(3)))
        save({"w": torch.full((3,), 2.0)}, self.ckpt, overwrite=True)
        self.assertTrue(torch.equal(distckpt.load_plain_tensors(self.ckpt)["w"], torch.full((3,), 2.0)))
        self.assertEqual(sorted(os.listdir(self.tmp)), ["ckpt"])

    def test_a_failed_save_keeps_the_previous_checkpoint(self):
        save({"w": torch.ones(3)}, self.ckpt)
        with warnings.catch_warnings(), self.assertRaisesRegex(BaseException, "cannot be stored in a distckpt"):
            warnings.simplefilter("ignore")  # "ComplexHalf support is experimental"
            save({"w": torch.ones(3), "q": torch.ones(2, dtype=torch.complex32)}, self.ckpt, overwrite=True)
        self.assertTrue(distckpt.verify(self.ckpt).intact)
        self.assertTrue(torch.equal(distckpt.load_plain_tensors(self.ckpt)["w"], torch.ones(3)))

    def test_a_target_another_writer_holds_is_refused_and_its_staging_kept(self):
        from distckpt._paths import StagingLock
        staging = os.path.join(self.tmp, ".ckpt.distckpt-staging")
        os.makedirs(staging)
        with open(os.path.join(staging, "theirs"), "w") as f:
            f.write("in progress")
        other = StagingLock(self.ckpt)  # as another process (or the C++ runtime) takes it
        with self.assertRaisesRegex(BaseException, "another save or export is writing .*ckpt.*wait for it"):
            save({"w": torch.ones(3)}, self.ckpt)
        with open(os.path.join(staging, "theirs")) as f:
            self.assertEqual(f.read(), "in progress")
        other.release()
        save({"w": torch.ones(3)}, self.ckpt)
        self.assertEqual(sorted(os.listdir(self.tmp)), ["ckpt"])  # no lock file left

    def test_a_failed_save_lets_the_next_one_lock_the_target(self):
        lock = os.path.join(self.tmp, ".ckpt.distckpt-lock")
        failed = distckpt.FileSystemWriter(self.ckpt)
        with warnings.catch_warnings(), self.assertRaisesRegex(BaseException, "cannot be stored in a distckpt"):
            warnings.simplefilter("ignore")
            _dcp.save({"q": torch.ones(2, dtype=torch.complex32)}, storage_writer=failed, no_dist=True)
        self.assertFalse(os.path.exists(lock))  # released as the coordinator's write failed
        # Claimed, but its save failed elsewhere (finish never came): taken over.
        abandoned = distckpt.FileSystemWriter(self.ckpt)
        abandoned._claim()
        self.assertTrue(os.path.exists(lock))
        save({"w": torch.ones(3)}, self.ckpt)
        self.assertTrue(distckpt.verify(self.ckpt).intact)
        self.assertEqual(sorted(os.listdir(self.tmp)), ["ckpt"])
        abandoned._release()  # a no-op now: the lock went with the save that took it over
        # Still writing: refused, as C++ refuses a save in flight.
        writing = distckpt.FileSystemWriter(self.ckpt, overwrite=True)
        writing._claim()
        with writing._in_use(), self.assertRaisesRegex(BaseException, "still in flight in this process"):
            save({"w": torch.zeros(3)}, self.ckpt, overwrite=True)
        writing._release()
        self.assertFalse(os.path.exists(lock))  # (its staging directory goes with the next save)

    def test_chunks_must_tile_their_tensor_exactly(self):
        """An overlap must not hide a hole: element counts alone would accept
        both, and a load would hand back uninitialised memory."""
        P = _index.Piece
        def tiles(shape, boxes):
            _index.check_tiling("w", shape, [P(o, n, None) for o, n in boxes])
        tiles((4, 4), [((0, 0), (2, 4)), ((2, 0), (2, 4))])  # the grid
        with self.assertRaisesRegex(distckpt.CorruptionError, r"two chunks overlap at \[2, 0\]"):
            tiles((4, 4), [((0, 0), (2, 4)), ((2, 0), (1, 4)), ((2, 0), (1, 4))])
        with self.assertRaisesRegex(distckpt.CorruptionError, r"no chunk holds the elements at \[3, 0\]"):
            tiles((4, 4), [((0, 0), (3, 4))])
        # Too irregular for a grid of cells (n column strips and n single cells): the sweep.
        n = 3000
        strips = [((0, j), (n, 1)) for j in range(n)] + [((i, n), (1, 1)) for i in range(n)]
        tiles((n, n + 1), strips)
        with self.assertRaisesRegex(distckpt.CorruptionError, r"chunks at \[0, 5\] and \[7, 5\] overlap"):
            tiles((n, n + 1), strips + [((7, 5), (1, 1))])
        with self.assertRaisesRegex(distckpt.CorruptionError, r"its chunks hold \d+ of its \d+ elements"):
            tiles((n, n + 1), strips[:-1])
        # A stacked axis of length 1 that every chunk spans changes nothing.
        tiles((1, n, n + 1), [((0,) + o, (1,) + z) for o, z in strips])
        cubes = [((0, j, k), (2, 1, 1)) for j in range(80) for k in range(80)]

        tiles((2, 80, 80), cubes)
        with self.assertRaisesRegex(distckpt.CorruptionError, "overlap"):
            tiles((2, 80, 80), cubes + [((1, 3, 3), (1, 1, 1))])

    def test_paths_out_of_the_checkpoint_are_refused(self):
        save({"w": torch.ones(3)}, self.ckpt)
        outside = os.path.join(self.tmp, "outside.bin")
        data = os.path.join(self.ckpt, "data/rank_00000.bin")
        shutil.move(data, outside)
        os.symlink(outside, data)
        with self.assertRaisesRegex(distckpt.CorruptionError, "outside the checkpoint"):
            distckpt.load_plain_tensors(self.ckpt)
        with self.assertRaisesRegex(distckpt.CorruptionError, r"unsafe path '\.\./x'.*'\.\.' components"):
            _format.validate_relative("../x")
        # Checked on the opened file too: a name approved, then swapped for a link, is still refused.
        from distckpt import _paths
        inside_file = os.path.join(self.tmp, "ckpt", "inside.bin")
        with open(inside_file, "wb") as f:
            f.write(b"x")
        full = _paths.inside(self.ckpt, "inside.bin")
        os.replace(inside_file, inside_file + ".old")
        os.symlink(outside, inside_file)
        fd = os.open(full, os.O_RDONLY)
        with self.assertRaisesRegex(distckpt.CorruptionError, "resolves to .*outside.bin, outside the checkpoint"):
            _paths.check_opened(self.ckpt, full, fd)

    def test_the_torch_2_call_sequence(self):
        """torch 2.x drives storage as below (reset, validate_checkpoint_id,
        set_up_storage_*, storage_meta); only 1.13 runs here, so its planners
        are driven through that sequence by hand."""
        planners = _dcp.dcp.default_planner
        sd = {"w": torch.arange(12.0).reshape(3, 4), "step": 9}
        writer = distckpt.FileSystemWriter("unused")
        writer.reset(self.ckpt)
        self.assertTrue(type(writer).validate_checkpoint_id(self.ckpt))
        writer.set_up_storage_writer(True)
        writer.storage_meta()  # None where StorageMeta does not exist (1.13)
        planner = planners.DefaultSavePlanner()
        planner.init(sd, True)
        plans, metadata = planner.create_global_plan([writer.prepare_local_plan(planner.create_local_plan())])
        plan = planner.finish_plan(writer.prepare_global_plan(plans)[0])
        writer.finish(metadata, [writer.write_data(plan, planner).value()])

        reader = distckpt.FileSystemReader("unused")
        reader.reset(self.ckpt)
        self.assertTrue(type(reader).validate_checkpoint_id(self.ckpt))
        self.assertFalse(type(reader).validate_checkpoint_id(self.tmp))
        md = reader.read_metadata()
        reader.set_up_storage_reader(md, True)
        got = {"w": torch.zeros(3, 4), "step": None}
        planner = planners.DefaultLoadPlanner()
        planner.init(got, md, True)
        plan = reader.prepare_global_plan([reader.prepare_local_plan(planner.create_local_plan())])[0]
        reader.read_data(planner.finish_plan(plan), planner).wait()
        self.assertTrue(torch.equal(got["w"], sd["w"]))
        self.assertEqual(got["step"], 9)

    def test_reads_are_windowed_down_to_the_wanted_part_of_a_row(self):
        w = torch.arange(240.0).reshape(6, 40)
        save({"w": w}, self.ckpt, block_size=16)
        original = _reader.WINDOW_BYTES
        _reader.WINDOW_BYTES = 64  # a 160-byte row is larger: copied row by row
        try:
            with _storage.Checkpoint(self.ckpt) as ckpt:
                piece = _index.build(ckpt).pieces["w"][0]
                dst = torch.zeros(4, 9)
                _reader.copy_region(ckpt, piece, 4, torch.float32, (1, 7), (4, 9), dst, "tensor 'w'")
                self.assertTrue(torch.equal(dst, w[1:5, 7:16]))
                # 4 rows x 9 floats, each row's run widened to whole 16-byte blocks: not the whole 960 bytes
                self.assertLessEqual(ckpt.bytes_read, 4 * (36 + 32))
            self.assertTrue(torch.equal(distckpt.load_plain_tensors(self.ckpt)["w"], w))
        finally:
            _reader.WINDOW_BYTES = original

    def crafted(self, metadata=None, common=None):
        """A committed checkpoint of the given metadata.fb / common.fb bytes."""
        os.makedirs(os.path.join(self.ckpt, "data"))
        metadata = metadata or _format.encode_metadata(_format.Metadata(1, 0, [], [], [], common_file="common.fb"))
        common = common or _common.encode({})
        for name, data in (("metadata.fb", metadata), ("common.fb", common)):
            with open(os.path.join(self.ckpt, name), "wb") as f:
                f.write(data)
        marker = _format.commit_marker_text(1, _format.RecordedFile("metadata.fb", len(metadata), _format.xxh3(metadata)),
                                            _format.RecordedFile("common.fb", len(common), _format.xxh3(common)), "test")
        with open(os.path.join(self.ckpt, "metadata.json"), "wb") as f:
            f.write(marker)

    def test_shared_nodes_cannot_expand_a_small_common_state(self):
        b = flatbuffers.Builder(0)
        node = None
        for depth in range(40):  # each list holds the previous one twice: 2^40 nodes in under 2 KB
            children = None
            if node is not None:
                Node.StartChildrenVector(b, 2)
                b.PrependUOffsetTRelative(node)
                b.PrependUOffsetTRelative(node)
                children = b.EndVector()
            Node.Start(b)
            Node.AddKind(b, NodeKind.List)
            if children is not None:
                Node.AddChildren(b, children)
            node = Node.End(b)
        CommonState.Start(b)
        CommonState.AddFormatVersion(b, 2)
        CommonState.AddRoot(b, node)
        b.Finish(CommonState.End(b), file_identifier=b"DCKC")
        with self.assertRaisesRegex(distckpt.CorruptionError, "more nodes than"):
            _common.decode(bytes(b.Output()), "common.fb")

    def test_a_tensor_its_chunks_do_not_cover_is_refused_before_allocating(self):
        self.crafted(_format.encode_metadata(_format.Metadata(
            1, 0, [_format.TensorRecord("huge", "float32", (1 << 40,))], [], [], common_file="common.fb")))
        with self.assertRaisesRegex(distckpt.CorruptionError, "store 0 of its 1099511627776 elements"):
            distckpt.load_plain_tensors(self.ckpt)

    def test_files_that_are_not_regular_are_refused(self):
        save({"w": torch.ones(3)}, self.ckpt)
        data = os.path.join(self.ckpt, "data/rank_00000.bin")
        os.remove(data)
        os.mkfifo(data)  # opening it for reading would block forever
        with self.assertRaisesRegex(distckpt.CorruptionError, "is not a regular file"):
            distckpt.load_plain_tensors(self.ckpt)
        self.assertFalse(distckpt.verify(self.ckpt).intact)
        os.remove(os.path.join(self.ckpt, "common.fb"))
        os.mkdir(os.path.join(self.ckpt, "common.fb"))
        with self.assertRaisesRegex(distckpt.CorruptionError, "common.fb is not a regular file"):
            distckpt.inspect(self.ckpt)

    def test_a_deeply_nested_marker_is_a_damaged_marker(self):
        os.makedirs(self.ckpt)
        with open(os.path.join(self.ckpt, "metadata.json"), "w") as f:
            f.write("[" * 100000)
        with self.assertRaisesRegex(distckpt.CorruptionError, "malformed JSON"):
            distckpt.inspect(self.ckpt)

    def test_flat_ranges_become_contiguous_boxes(self):
        for shape in [(5,), (3, 4), (2, 3, 4), ()]:
            numel = 1
            for n in shape:
                numel *= n
            for start, stop in itertools.combinations(range(numel + 1), 2):
                flat = []
                for offset, length, first in _index.flat_boxes(shape, start, stop):
                    box = torch.arange(numel).reshape(shape)
                    for axis, (o, n) in enumerate(zip(offset, length)):
                        box = box.narrow(axis, o, n)
                    values = box.reshape(-1).tolist()
                    self.assertEqual(values, list(range(first, first + len(values))), (shape, start, stop))
                    flat += values
                self.assertEqual(flat, list(range(start, stop)), (shape, start, stop))


if __name__ == "__main__":
    unittest.main()
