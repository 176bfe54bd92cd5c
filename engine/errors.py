"""Engine error types (the server maps them to HTTP statuses)."""


class EngineError(Exception):
    """Base class of engine errors."""


class CheckpointError(EngineError):
    """A checkpoint folder is missing a file, a field or a tensor, or is malformed.
    The message names the file and the field."""


class UnsupportedArchitecture(CheckpointError):
    """``architectures[0]`` names no registered model class."""


class StepFailed(EngineError):
    """One step's forward, sampling or bookkeeping raised (a bug or a device fault, not
    client input). ``seqs`` were in that step: the engine has dropped them from its
    running set; the caller fails their requests and drops their caches. Every other
    sequence is untouched."""

    def __init__(self, seqs: list, cause: BaseException):
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.seqs = seqs
        self.cause = cause
