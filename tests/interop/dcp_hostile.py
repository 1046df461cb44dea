"""Hostile copies of a DCP checkpoint, for the reader's refusals.

    python3 dcp_hostile.py SRC_DIR OUT_ROOT

SRC_DIR is a checkpoint dcp_native_save.py wrote with one rank (its own,
trusted .metadata is read back here with pickle). Each case is a copy of it
in OUT_ROOT/<case> with one thing changed:
    escape       a chunk of "rows" stored at "../outside.distcp" (which exists)
    absolute     a chunk of "rows" stored at the absolute path of a real file
    past_end     the item of "rows" 1000 bytes longer than its file
    lying        "rows" [10, 4] pointed at the item of "plain.weight" [5, 3]
    code         .metadata also holds an object that would run
                 `touch OUT_ROOT/code/pwned` when unpickled (os.system)
    truncated    .metadata cut in half
"""
import os
import pickle
import shutil
import sys

import dcp_common  # noqa: F401  (imports DCP's classes, which unpickling the source needs)


class RunsCode:
    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def storage_of(metadata, fqn):
    return [k for k in metadata.storage_data if k.fqn == fqn]


def main(src, root):
    with open(os.path.join(src, ".metadata"), "rb") as f:
        original = f.read()

    def copy(case, metadata=None, raw=None):
        out = os.path.join(root, case)
        shutil.copytree(src, out)
        with open(os.path.join(out, ".metadata"), "wb") as f:
            f.write(raw if raw is not None else pickle.dumps(metadata, protocol=4))
        return out

    def fresh():
        return pickle.loads(original)

    m = fresh()
    (rows,) = storage_of(m, "rows")
    shutil.copy(os.path.join(src, m.storage_data[rows].relative_path), os.path.join(root, "outside.distcp"))
    m.storage_data[rows].relative_path = "../outside.distcp"
    copy("escape", m)

    m = fresh()
    m.storage_data[rows].relative_path = os.path.abspath(os.path.join(root, "outside.distcp"))
    copy("absolute", m)

    m = fresh()
    m.storage_data[rows].length += 1000
    copy("past_end", m)

    m = fresh()
    (weight,) = storage_of(m, "plain.weight")
    m.storage_data[rows] = m.storage_data[weight]
    copy("lying", m)

    m = fresh()
    m.planner_data = RunsCode(f"touch {os.path.join(root, 'code', 'pwned')}")
    copy("code", m)

    copy("truncated", raw=original[:len(original) // 2])
    print("hostile copies written")


if __name__ == "__main__":
    main(*sys.argv[1:])
