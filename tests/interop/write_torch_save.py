"""Writes torch.save files with the real PyTorch, as training scripts do.

    python3 write_torch_save.py OUT

OUT/state.pt    model.state_dict()-like: every tensor of write_safetensors.TENSORS
                at the top level (an OrderedDict), plus "iteration" and a
                tensor-free "optimizer" (int keys, lists, floats)
OUT/nested.pt   {"model": {"w": ..., "inner": {"b": ..., "c": ...}}, "epoch": 2}
OUT/list.pt     a list, not a dict
OUT/one.pt      {"w": ...}: a dict of one entry (pickle's SETITEM)
OUT/views.pt    a Parameter, and two views of one storage (one strided), pickle protocol 4
OUT/expanded.pt an expanded view: 4 x 3 elements over a storage of 3 (refused)
OUT/big.pt      "big": arange(BIG) in float32 (48 MiB), "cols": a strided view, "flag": bools
OUT/transposed.pt strided views as converted checkpoints hold them: "wt" = arange(48).reshape(6, 8).t()
                (float32 [8, 6], strides [1, 8]), "mask" a transposed bool tensor, "half" a column
                slice in float16, "row" a contiguous view at an offset of wt's storage
OUT/zip64.pt    state.pt's records rewritten by Python's zipfile with every size,
                offset and count in zip64 records, and an archive comment
OUT/damaged.pt  state.pt with one byte of its first storage flipped (its CRC-32
                no longer matches; torch.load does not check it)
OUT/module.pt   torch.save(nn.Linear(4, 3).state_dict()): an OrderedDict with a
                `_metadata` attribute (pickle's BUILD); weight = arange, bias = -arange
OUT/many.pt     300 small tensors of five dtypes (every seventh empty) and "large",
                5,000 float32 (more than a 4 KiB window)
Refused, each a few KiB standing for far more, or naming one thing twice:
OUT/fanout.pt   a list of two references to a list of two references ... 40 deep
OUT/aliases.pt  one 1 MiB storage under 100 names
OUT/twice.pt    {"a.b": x, "a": {"b": y}}: two tensors named "a.b"
OUT/intkey.pt   {0: 1, "0": 2, "w": x}: one key twice in the common values
OUT/globals.pt  a hand-made pickle: one memoized 100 KB string made into 20000 global names
OUT/nones.pt    a hand-made pickle: 2^20 + 2 None values pushed and never consumed
"""
import collections
import os
import struct
import sys
import zipfile

import torch

from write_safetensors import TENSORS, value

BIG = 12 << 20


def rewrite_as_zip64(src, dst):
    """Copies every record of src into dst as stored zip64 entries."""
    limits = zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT
    zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT = 0, 0  # every field escaped into zip64 records
    try:
        with zipfile.ZipFile(src) as z, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as out:
            for info in z.infolist():
                out.writestr(info.filename, z.read(info.filename))
            out.comment = b"rewritten with zip64 records"
    finally:
        zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT = limits


def flip_first_storage_byte(src, dst):
    data = bytearray(open(src, "rb").read())
    with zipfile.ZipFile(src) as z:
        info = z.getinfo(z.namelist()[0].split("/")[0] + "/data/0")
    name_len, extra_len = struct.unpack("<HH", data[info.header_offset + 26:info.header_offset + 30])
    data[info.header_offset + 30 + name_len + extra_len + 5] ^= 0x10
    open(dst, "wb").write(bytes(data))


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    state = collections.OrderedDict((name, value(k, shape, dtype)) for k, (name, shape, dtype) in enumerate(TENSORS))
    state["iteration"] = 7
    state["optimizer"] = {"state": {0: {"step": 3, "exp_avg_count": 1}, 1: {"step": 3, "exp_avg_count": 2}},
                          "param_groups": [{"lr": 0.5, "params": [0]}], "scheduler": None}
    torch.save(state, os.path.join(out, "state.pt"))
    nested = {"model": {"w": torch.arange(6.0).reshape(2, 3), "inner": {"b": torch.ones(2, dtype=torch.float16),
                                                                             "c": torch.tensor(4)}},
              "epoch": 2}
    torch.save(nested, os.path.join(out, "nested.pt"))
    torch.save([torch.zeros(2)], os.path.join(out, "list.pt"))
    torch.save({"w": torch.zeros(2)}, os.path.join(out, "one.pt"))
    base = torch.arange(12.0).reshape(3, 4)
    torch.save({"p": torch.nn.Parameter(torch.ones(2, 3)), "cols": base[:, 1:3], "row": base[2]},
               os.path.join(out, "views.pt"), pickle_protocol=4)
    torch.save({"e": torch.zeros(3).expand(4, 3), "w": torch.zeros(2)}, os.path.join(out, "expanded.pt"))
    torch.save({"big": torch.arange(BIG, dtype=torch.float32), "cols": base[:, 1:3],
                "flag": torch.tensor([True, False, True])}, os.path.join(out, "big.pt"))
    wide = torch.arange(48.0).reshape(6, 8)
    torch.save({"wt": wide.t(), "mask": (torch.arange(12).reshape(3, 4) % 3 == 0).t(),
                "half": torch.arange(30.0, dtype=torch.float16).reshape(5, 6)[:, 2:5], "row": wide[4]},
               os.path.join(out, "transposed.pt"))
    rewrite_as_zip64(os.path.join(out, "state.pt"), os.path.join(out, "zip64.pt"))
    flip_first_storage_byte(os.path.join(out, "state.pt"), os.path.join(out, "damaged.pt"))
    module = torch.nn.Linear(4, 3)
    with torch.no_grad():
        module.weight.copy_(torch.arange(12.0).reshape(3, 4))
        module.bias.copy_(-torch.arange(3.0))
    torch.save(module.state_dict(), os.path.join(out, "module.pt"))
    many = {}
    for i in range(300):
        dtype = (torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.float64)[i % 5]
        many[f"t{i:03d}"] = (torch.arange(i % 7 * 3, dtype=torch.float64) - i).to(dtype)
    many["large"] = torch.arange(5000, dtype=torch.float32)
    torch.save(many, os.path.join(out, "many.pt"))
    fanout = [0]
    for _ in range(40):
        fanout = [fanout, fanout]
    torch.save({"x": fanout, "w": torch.ones(1)}, os.path.join(out, "fanout.pt"))
    shared = torch.zeros(1 << 18)
    torch.save({f"k{i}": shared for i in range(100)}, os.path.join(out, "aliases.pt"))
    torch.save({"a.b": torch.ones(2), "a": {"b": torch.zeros(3)}}, os.path.join(out, "twice.pt"))
    torch.save({0: 1, "0": 2, "w": torch.ones(1)}, os.path.join(out, "intkey.pt"))
    long_name = b"X" + struct.pack("<I", 100000) + b"a" * 100000 + b"q\x00"
    write_pickle(os.path.join(out, "globals.pt"), b"\x80\x02" + long_name + b"h\x00h\x00\x93" * 20000 + b".")
    write_pickle(os.path.join(out, "nones.pt"), b"\x80\x02" + b"N" * ((1 << 20) + 2) + b".")


def write_pickle(path, pickle):
    """A torch.save archive around a hand-made data.pkl."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pickle)
        z.writestr("archive/byteorder", b"little")
        z.writestr("archive/version", b"3\n")


if __name__ == "__main__":
    main()
