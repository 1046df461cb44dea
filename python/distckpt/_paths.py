"""Paths read from a checkpoint are untrusted: nothing named in it may make a
reader open (or a writer replace) anything outside the checkpoint directory,
not through '..', an absolute path, or a symbolic link."""
import os

from ._errors import CheckpointError, CorruptionError

_MAX_PATH = 4096


def validate_relative(path: str) -> None:
    """The rules of the C++ runtime (io/safe_path.cpp): '/'-separated, no
    empty, '.' or '..' component, not absolute, no NUL."""
    problem = None
    if not path:
        problem = "the path is empty"
    elif len(path) > _MAX_PATH:
        problem = f"longer than {_MAX_PATH} bytes"
    elif "\0" in path:
        problem = "it contains a NUL byte"
    elif path.startswith("/"):
        problem = "absolute paths are not allowed"
    else:
        for part in path.split("/"):
            if part in ("", ".", ".."):
                problem = f"'{part}' components are not allowed" if part else "it has an empty component"
                break
    if problem:
        shown = path[:200].encode("unicode_escape").decode("ascii")
        raise CorruptionError(f"unsafe path '{shown}' in checkpoint metadata: {problem}")


def inside(root: str, relative: str) -> str:
    """ROOT/RELATIVE, refused unless it resolves (symbolic links followed)
    inside ROOT."""
    validate_relative(relative)
    real_root = os.path.realpath(root)
    full = os.path.join(root, relative)
    real = os.path.realpath(full)
    if os.path.commonpath([real_root, real]) != real_root:
        raise CorruptionError(f"{full} resolves to {real}, outside the checkpoint {root}; refusing to follow it "
                              "(copy the checkpoint with `cp -L` if the link is intended)")
    return full


def staging_paths(target: str):
    """(target, parent, staging, old) as the C++ runtime names them, so a save
    from either side finds what the other left (io/staging.cpp)."""
    target = os.path.normpath(target)
    name = os.path.basename(target)
    if name in ("", ".", ".."):
        raise CheckpointError(f"cannot write a checkpoint into '{target}': name a directory")
    parent = os.path.dirname(target) or "."
    return target, parent, os.path.join(parent, f".{name}.distckpt-staging"), os.path.join(parent, f".{name}.distckpt-old")
