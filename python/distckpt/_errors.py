"""The errors of the Python bridge: the C++ runtime's classes, by the same
names and for the same causes (distckpt/core/errors.h), so that a program
catches one class whichever side read the checkpoint.

    Error                      anything else
    +- UsageError              the caller asked for something that cannot be done
    |  +- ShardingError
    |  +- KeyMismatchError
    +- CheckpointError         no (committed) checkpoint there, unknown format or version
    |  +- CorruptionError      stored bytes fail a check: damaged, incomplete or hostile
    |  +- UntrustedObjectError an object's pickle asks for what the restricted reader does not build (Python only)
    +- IoError                 a system call on a file failed (also an OSError: errno, filename)
    +- CommError
       +- TimeoutError
       +- ProtocolError
"""
import errno as _errno
import os


class Error(RuntimeError):
    """Any distckpt failure; the subclass says which kind."""


class UsageError(Error, ValueError):
    """The caller asked for something that cannot be done (the message says what to pass instead)."""


class ShardingError(UsageError):
    """Inconsistent sharding of a tensor or object."""


class KeyMismatchError(UsageError):
    """Keys requested but not stored, or stored but not requested (strict loading)."""


class CheckpointError(Error):
    """No committed checkpoint at the path, or one of an unknown format or version (the message says what to do)."""


class CorruptionError(CheckpointError):
    """Stored bytes or metadata fail a check: the checkpoint is damaged, incomplete or hostile."""


class UntrustedObjectError(CheckpointError):
    """An object of the checkpoint (a pickle) names a global that is not on the
    allow-list of what checkpoints hold, or asks for an operation the
    restricted reader does not perform: unpickling it could run code. Python
    only (the C++ runtime never unpickles objects). `key` is the object's key,
    `global_name` the "module.name" the pickle named (None when the refusal is
    about something else). FileSystemReader(path, trust_objects=True) loads
    such objects with torch.load, for checkpoints from a trusted source."""

    def __init__(self, message: str, key: str = "", global_name=None):
        super().__init__(message)
        self.key = key
        self.global_name = global_name


class IoError(Error, OSError):
    """A system call on a checkpoint file failed: `errno` and `filename` as for OSError."""

    def __init__(self, message: str, path: str = "", error_number: int = 0):
        OSError.__init__(self, error_number, message, path)
        self.message = message

    def __str__(self):
        return self.message


class CommError(Error):
    """A collective failed, or a peer did."""


class TimeoutError(CommError):  # noqa: A001 - the C++ class's name
    """A peer did not answer within the timeout."""


class ProtocolError(CommError):
    """A peer sent malformed bytes."""


def from_os_error(e: OSError, what: str, path: str, missing_is_corruption: bool = False) -> Error:
    """The error for a failed system call WHAT on PATH, as the C++ runtime
    classes it: a file the checkpoint lists that is not there makes the
    checkpoint incomplete (CorruptionError); anything else is an IoError."""
    text = e.strerror or os.strerror(e.errno or 0)
    if missing_is_corruption and e.errno == _errno.ENOENT:
        return CorruptionError(f"{path}, listed in the checkpoint, is missing ({text}); the checkpoint is "
                               "incomplete or damaged")
    return IoError(f"{what} '{path}' failed: {text}", path, e.errno or 0)
