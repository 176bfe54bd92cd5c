"""Engine error types (the server maps them to HTTP statuses)."""


class EngineError(Exception):
    """Base class of engine errors."""


class CheckpointError(EngineError):
    """A checkpoint folder is missing a file, a field or a tensor, or is malformed.
    The message names the file and the field."""


class UnsupportedArchitecture(CheckpointError):
    """``architectures[0]`` names no registered model class."""
