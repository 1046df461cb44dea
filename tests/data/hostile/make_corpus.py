"""Writes the corpus of damaged and hostile checkpoints that the C++ runtime
(tests/unit/hostile_corpus_test.cpp) and the Python package
(python/tests/test_hostile_corpus.py) both open, each expecting the same
error class from reading every tensor and the common state, and the same
verify status (cases.json). Rerun after a format change:

    PYTHONPATH=build/python /usr/bin/python3 tests/data/hostile/make_corpus.py

Each case starts from one small intact checkpoint (written by the Python
package: "w" [4, 2] float32 and "bias" [3] in one data file, and a common
value) and changes it the way damage, an interrupted copy or a hostile
author would; cases that change metadata.fb re-record its size and XXH3 in
the commit marker, so that the reader gets past the marker's check and meets
the hostile content itself."""
import json
import os
import shutil
import sys
import tempfile

import distckpt  # before torch.distributed._shard under Python 3.11 with torch 1.13
import torch

from distckpt import _dcp, _format

HERE = os.path.dirname(os.path.abspath(__file__))


def write_base(path):
    """One process: one data file; 16-byte checksum blocks, so "w" has two."""
    state = {"w": torch.arange(8, dtype=torch.float32).reshape(4, 2), "bias": torch.tensor([1.0, 2.0, 3.0]),
             "iteration": 7}
    _dcp.save(state, storage_writer=distckpt.FileSystemWriter(path, block_size=16), no_dist=True)


def load_meta(path):
    marker = _format.load_commit_marker(path)
    raw = open(os.path.join(path, marker.metadata.path), "rb").read()
    return marker, _format.decode_metadata(raw, "base")


def resign(path, meta=None, raw=None):
    """metadata.fb from META (or the bytes RAW), recorded anew in the marker."""
    marker = _format.load_commit_marker(path)
    data = raw if raw is not None else _format.encode_metadata(meta)
    with open(os.path.join(path, marker.metadata.path), "wb") as f:
        f.write(data)
    record = _format.RecordedFile(marker.metadata.path, len(data), _format.xxh3(data))
    with open(os.path.join(path, _format.COMMIT_FILE), "wb") as f:
        f.write(_format.commit_marker_text(marker.world_size, record, marker.common, marker.created_by))


def flip(path, relative, at=0):
    full = os.path.join(path, relative)
    data = bytearray(open(full, "rb").read())
    data[at] ^= 0x10
    open(full, "wb").write(bytes(data))


def truncate(path, relative, by=1):
    full = os.path.join(path, relative)
    os.truncate(full, os.path.getsize(full) - by)


def edit_marker(path, change):
    full = os.path.join(path, _format.COMMIT_FILE)
    doc = json.load(open(full))
    change(doc)
    open(full, "w").write(json.dumps(doc, indent=2) + "\n")


def data_file(path):
    _, meta = load_meta(path)
    return meta.files[meta.tensors[0].chunks[0].file].path


def with_meta(change):
    def apply(path):
        _, meta = load_meta(path)
        change(meta)
        resign(path, meta)
    return apply


def chunk(meta, key):
    return next(t for t in meta.tensors if t.key == key).chunks[0]


def set_path(meta, value):
    meta.files[0].path = value


def past_end(meta):
    c = chunk(meta, "w")
    c.byte_offset = meta.files[c.file].size + 64


def overlap(meta):
    t = next(t for t in meta.tensors if t.key == "w")
    c = t.chunks[0]
    # Two chunks of rows 0-1 (one listed twice), rows 2-3 held by none.
    half = _format.ChunkRecord((0, 0), (2, 2), None, c.file, c.byte_offset, 16, c.checksums[:1])
    again = _format.ChunkRecord((0, 0), (2, 2), None, c.file, c.byte_offset + 16, 16, c.checksums[1:2])
    t.chunks = [half, again]


def unknown_dtype(meta):
    next(t for t in meta.tensors if t.key == "bias").dtype = "float99"


def unrelated(path):
    """A directory of something else (git keeps no empty directory)."""
    shutil.rmtree(path)
    os.makedirs(path)
    with open(os.path.join(path, "notes.txt"), "w") as f:
        f.write("not a checkpoint\n")


def link_outside(path):
    relative = data_file(path)
    full = os.path.join(path, relative)
    os.remove(full)
    os.symlink("../../outside.bin", full)


C, CP, NC, OK = "CorruptionError", "CheckpointError", "not_a_checkpoint", "intact"
# name -> (class a full read raises, what verify says, what is done to the base)
CASES = {
    "unrelated_directory": (CP, NC, unrelated),
    "no_commit_marker": (CP, "corrupt", lambda p: os.remove(os.path.join(p, _format.COMMIT_FILE))),
    "marker_not_json": (C, "corrupt", lambda p: open(os.path.join(p, _format.COMMIT_FILE), "w").write('{"format": "dist')),
    "marker_newer_version": (CP, NC, lambda p: edit_marker(p, lambda d: d.update(version=99))),
    "marker_wrong_metadata_size": (C, "corrupt",
                                   lambda p: edit_marker(p, lambda d: d["metadata"].update(bytes=d["metadata"]["bytes"] + 1))),
    "metadata_flipped_byte": (C, "corrupt", lambda p: flip(p, "metadata.fb", 40)),
    "metadata_not_flatbuffers": (C, "corrupt", lambda p: resign(p, raw=b"\x08\x00\x00\x00DCKMgarbage-garbage")),
    "common_flipped_byte": (C, "corrupt", lambda p: flip(p, "common.fb", 20)),
    "data_flipped_byte": (C, "corrupt", lambda p: flip(p, data_file(p), 3)),
    "data_file_missing": (C, "corrupt", lambda p: os.remove(os.path.join(p, data_file(p)))),
    "data_file_truncated": (C, "corrupt", lambda p: truncate(p, data_file(p))),
    "data_path_dot_dot": (C, "corrupt", with_meta(lambda m: set_path(m, "data/../../outside.bin"))),
    "data_path_absolute": (C, "corrupt", with_meta(lambda m: set_path(m, "/etc/passwd"))),
    "data_link_outside": (C, "corrupt", link_outside),
    "chunk_past_file_end": (C, "corrupt", with_meta(past_end)),
    "chunks_overlap_and_leave_a_hole": (C, "corrupt", with_meta(overlap)),
    # A dtype a newer writer may use: not damage; that tensor alone cannot be read.
    "unknown_dtype": (CP, OK, with_meta(unknown_dtype)),
}


def main():
    with tempfile.TemporaryDirectory() as tmp:
        base = os.path.join(tmp, "base")
        write_base(base)
        expected = {}
        for name, (error_class, verified, damage) in sorted(CASES.items()):
            out = os.path.join(HERE, name)
            shutil.rmtree(out, ignore_errors=True)
            shutil.copytree(base, out, symlinks=True)
            damage(out)
            expected[name] = {"error": error_class, "verify": verified}
    with open(os.path.join(HERE, "cases.json"), "w") as f:
        json.dump(expected, f, indent=2, sort_keys=True)
        f.write("\n")
    # The file a link or '..' path would reach: its presence must not matter.
    with open(os.path.join(HERE, "outside.bin"), "wb") as f:
        f.write(bytes(range(64)))
    print(f"{len(expected)} cases in {HERE}")


if __name__ == "__main__":
    sys.exit(main())
