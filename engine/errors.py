"""Engine error types (the server maps them to HTTP statuses), and the one range check
of client token ids."""


class EngineError(Exception):
    """Base class of engine errors."""


class EngineStopped(EngineError, RuntimeError):
    """The engine thread is not running (shutting down or dead): a call cannot run."""


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


class SlotError(EngineError):
    """A slot operation that cannot run; ``code`` names why (a stable, machine-readable
    string the server puts in its error body). Nothing was changed."""

    code: str | None = None  # None: the server uses the HTTP status as the code

    def __init__(self, message: str, code: str | None = None, **extra):
        super().__init__(message)
        if code is not None:
            self.code = code
        self.extra = extra


class SlotBusy(SlotError):
    """The slot is running a request and the caller asked not to wait, or it is being
    set up for one; retry."""

    code = "slot_busy"


class SlotFilesOff(SlotError):
    """No slot save directory was configured."""


class SlotFileMissing(SlotError):
    code = "file_not_found"


class BadSlotFile(SlotError):
    """A bad file name, an unreadable or corrupted file, a file of another model or one
    that does not fit this server's cache (``code`` says which)."""

    code = "invalid_slot_file"


class SlotWriteFailed(SlotError):
    """The file system refused the write (full disk, permissions)."""

    code = "write_failed"


class NoRoom(SlotError):
    """Not enough free cache, even after dropping idle slots' caches; retry later."""


class RequestError(ValueError):
    """A request the scheduler refuses before queueing it (a client error)."""

    def __init__(self, message: str, type_: str = "invalid_request_error", **extra):
        super().__init__(message)
        self.type = type_
        self.extra = extra


def check_token_ids(ids: list[int], vocab: int, field: str = "prompt") -> None:
    """The one range check of client token ids: RequestError (a 400) naming the field."""
    bad = next((t for t in ids if not 0 <= t < vocab), None)
    if bad is not None:
        raise RequestError(f"{field}: token ids must be in [0, {vocab}), got {bad}", code="invalid_token_id")


class QueueFull(RuntimeError):
    """The waiting queue is at ``max_queue``: retry later."""
