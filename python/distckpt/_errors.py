"""The errors of the Python bridge, named as in the C++ runtime."""


class CheckpointError(RuntimeError):
    """A checkpoint cannot be read or written as asked (the message says what to do)."""


class CorruptionError(CheckpointError):
    """Stored bytes or metadata fail a check: the checkpoint is damaged."""
