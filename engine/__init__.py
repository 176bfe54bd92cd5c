"""The engine: checkpoint loading, models, scheduling of tokens, sampling."""

from engine.config import DEMO_MODEL, EngineConfig
from engine.engine import Engine, Generation
from engine.errors import CheckpointError, EngineError, StepFailed, UnsupportedArchitecture
from engine.sampling_params import GREEDY, SamplingParams
from engine.sequence import FinishReason, Sequence, StepEvent

__all__ = [
    "DEMO_MODEL",
    "GREEDY",
    "CheckpointError",
    "Engine",
    "EngineConfig",
    "EngineError",
    "FinishReason",
    "Generation",
    "SamplingParams",
    "Sequence",
    "StepEvent",
    "StepFailed",
    "UnsupportedArchitecture",
]
