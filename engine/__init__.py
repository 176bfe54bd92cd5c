"""The engine, and its one door: ``server/`` imports these names and nothing deeper.

Rooms: ``scheduling/`` (requests on slots, the engine thread), ``core/`` (one step:
plan, forward, sample), ``sampling/`` (sampler, parameters, grammars), ``text/``
(tokenizer, detokenizer, chat templates), ``loading/`` (HF folders and GGUF files),
``models/`` (one file per architecture), ``kernels/`` (compute kernels). At the top:
``service`` (the facade the server drives), ``config``, ``errors`` and ``slot_files``.
"""

from engine.config import DEMO_MODEL, EngineConfig
from engine.core.encoder import is_encoder
from engine.core.engine import Engine, Generation
from engine.core.sequence import FinishReason, Sequence, StepEvent, TokenLogprob
from engine.encoder_service import EncoderService, Ranked, probability
from engine.errors import (
    BadSlotFile,
    CheckpointError,
    EngineError,
    EngineStopped,
    NoRoom,
    QueueFull,
    RequestError,
    SlotBusy,
    SlotError,
    SlotFileMissing,
    SlotFilesOff,
    SlotWriteFailed,
    StepFailed,
    UnsupportedArchitecture,
    check_token_ids,
)
from engine.sampling.grammar import ANY_JSON_OBJECT, JSON_OPTIONS, Constraint
from engine.sampling.params import GREEDY, LLAMA_ORDER, OPENAI_ORDER, SAMPLERS, SamplingParams
from engine.sampling.reasoning_budget import BudgetSpec
from engine.scheduling.request import Admitted, Delta, Failed, Progress, Request, RequestEnd, RequestEvent
from engine.service import EngineService, SlotInfo
from engine.slot_files import MAX_NAME_CHARS, NAME_PATTERN, SlotFiles
from engine.text.chat_template import ChatTemplate, ChatTemplateError
from engine.text.fim import FimTokens, infill_prompt
from engine.text.images import MAX_IMAGES, BadImage, ImageBudget, ImagesBusy
from engine.text.tokenizer import TokenizeError

__all__ = [
    "EncoderService",
    "Ranked",
    "is_encoder",
    "probability",
    "BadImage",
    "ImageBudget",
    "ImagesBusy",
    "MAX_IMAGES",
    "ANY_JSON_OBJECT",
    "DEMO_MODEL",
    "GREEDY",
    "LLAMA_ORDER",
    "OPENAI_ORDER",
    "SAMPLERS",
    "JSON_OPTIONS",
    "MAX_NAME_CHARS",
    "NAME_PATTERN",
    "Admitted",
    "BadSlotFile",
    "BudgetSpec",
    "ChatTemplate",
    "ChatTemplateError",
    "CheckpointError",
    "Constraint",
    "Delta",
    "Engine",
    "EngineConfig",
    "EngineError",
    "EngineService",
    "EngineStopped",
    "Failed",
    "FimTokens",
    "FinishReason",
    "Generation",
    "NoRoom",
    "Progress",
    "QueueFull",
    "Request",
    "RequestEnd",
    "RequestError",
    "RequestEvent",
    "SamplingParams",
    "Sequence",
    "SlotBusy",
    "SlotError",
    "SlotFileMissing",
    "SlotFiles",
    "SlotFilesOff",
    "SlotInfo",
    "SlotWriteFailed",
    "StepEvent",
    "StepFailed",
    "TokenLogprob",
    "TokenizeError",
    "UnsupportedArchitecture",
    "check_token_ids",
    "infill_prompt",
]
