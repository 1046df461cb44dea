"""Paths read from a checkpoint are untrusted: nothing named in it may make a
reader open (or a writer replace) anything outside the checkpoint directory,
not through '..', an absolute path, or a symbolic link."""
import errno
import fcntl
import os
import warnings
import weakref

from ._errors import CheckpointError, CorruptionError, UsageError

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
    full = os.path.join(root, relative)
    _check_resolved(root, full, os.path.realpath(full))
    return full


def check_opened(root: str, full: str, fd: int) -> None:
    """Refuses (closing FD) unless the file FD opened lies inside ROOT:
    checked on the descriptor, a link swapped in after `inside` approved the
    name cannot redirect the read."""
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return  # no /proc: `inside` checked the name
    try:
        _check_resolved(root, full, real)
    except CorruptionError:
        os.close(fd)
        raise


def _hub_blobs(real_root: str):
    """The blobs folder of the Hugging Face hub repository REAL_ROOT is a
    snapshot (or a folder of one) of: <repo>/snapshots/<revision>/... links
    its files into <repo>/blobs. None otherwise (io/safe_path.cpp)."""
    at = real_root.find("/snapshots/")
    while at > 0:
        rest = real_root[at + len("/snapshots/"):]
        if rest and not rest.startswith("/"):
            return real_root[:at] + "/blobs"
        at = real_root.find("/snapshots/", at + 1)
    return None


def _check_resolved(root: str, full: str, real: str) -> None:
    real_root = os.path.realpath(root)
    blobs = _hub_blobs(real_root)
    if blobs is not None and os.path.commonpath([blobs, real]) == blobs:
        return
    if os.path.commonpath([real_root, real]) != real_root:
        raise CorruptionError(f"{full} resolves to {real}, outside the checkpoint {root}; refusing to follow it "
                              "(copy the checkpoint with `cp -L` if the link is intended)")


def staging_paths(target: str):
    """(target, parent, staging, old) as the C++ runtime names them, so a save
    from either side finds what the other left (io/staging.cpp)."""
    target = os.path.normpath(target)
    name = os.path.basename(target)
    if name in ("", ".", ".."):
        raise UsageError(f"cannot write a checkpoint into '{target}': name a directory")
    parent = os.path.dirname(target) or "."
    return target, parent, os.path.join(parent, f".{name}.distckpt-staging"), os.path.join(parent, f".{name}.distckpt-old")


# The staging locks this process holds, by lock file, each with the writer
# that owns it. A save that fails on another rank never reaches its
# writer's finish(), so its lock lives as long as that writer: a new save of
# the same target in this process takes it over, unless the owner is still
# writing or committing (then it is refused, as C++ refuses a save in flight).
_HELD = weakref.WeakValueDictionary()


def claim_staging(target: str, writer) -> "StagingLock":
    """TARGET's staging lock for WRITER (which has an `active` property):
    taken, or taken over from an idle earlier writer of this process."""
    held = _HELD.get(StagingLock.path_of(target))
    if held is not None and held.held:
        owner = held.owner()
        if owner is not None and owner is not writer and owner.active:
            raise CheckpointError(f"a save into '{target}' is still in flight in this process; wait for it to "
                                  "finish before saving into the same directory again")
    else:
        held = StagingLock(target)
        _HELD[held.path] = held
    held.owner = weakref.ref(writer)
    return held


class StagingLock:
    """Keeps every other writer of TARGET out of its staging name while this
    one writes: an exclusive flock on '.NAME.distckpt-lock' beside it, the
    lock the C++ runtime takes (io/staging.cpp), removed on release."""

    @staticmethod
    def path_of(target: str) -> str:
        target = os.path.normpath(target)
        return os.path.join(os.path.dirname(target) or ".", f".{os.path.basename(target)}.distckpt-lock")

    def __init__(self, target: str):
        self.path = self.path_of(target)
        self.owner = lambda: None
        self._fd = None
        # A holder that releases removes its file after we opened it: the
        # lock we got is then on a file no one else sees, and we try again.
        for _ in range(100):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
            try:
                if self._lock(fd, target):
                    self._fd, fd = fd, None
                    return
            finally:
                if fd is not None:
                    os.close(fd)
        raise CheckpointError(f"cannot lock '{self.path}': it was replaced 100 times while being locked")

    def _lock(self, fd: int, target: str) -> bool:
        """Whether FD now holds the lock of the file at self.path."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CheckpointError(f"another save or export is writing '{target}' (it holds '{self.path}'); "
                                  "wait for it to finish or write elsewhere (nothing was written)") from None
        except OSError as e:
            if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
            warnings.warn(f"the file system of '{self.path}' has no locks ({e.strerror}): nothing keeps another "
                          "writer of the same target out while this one writes")
            return True
        try:
            held, named = os.fstat(fd), os.lstat(self.path)
        except FileNotFoundError:
            return False
        return (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self):
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.unlink(self.path)  # before unlocking: see __init__
            except FileNotFoundError:
                pass
            finally:
                os.close(fd)

    def __del__(self):
        self.release()
