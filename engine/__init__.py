"""The engine, and its one door: ``server/`` imports these names and nothing deeper.

Rooms: ``scheduling/`` (requests on slots, the engine thread), ``core/`` (one step:
plan, forward, sample), ``sampling/`` (sampler, parameters, grammars), ``text/``
(tokenizer, detokenizer, chat templates), ``loading/`` (HF folders and GGUF files),
``models/`` (one file per architecture), ``kernels/`` (compute kernels). At the top:
``service`` (the facade the server drives), ``config``, ``errors`` and ``slot_files``.

The door opens lazily: a name is imported from its room when first asked for, so a
process that needs only a light part (the router, ``slotserve --help``: settings,
errors, the demo model's path) never imports torch.
"""

from __future__ import annotations

import importlib

_ROOMS = {  # room -> the names it gives the door
    "engine.demo": ("DEMO_MODEL",),
    "engine.config": ("EngineConfig",),
    "engine.core.encoder": ("is_encoder",),
    "engine.core.engine": ("Engine", "Generation"),
    "engine.core.sequence": ("FinishReason", "Sequence", "StepEvent", "TokenLogprob"),
    "engine.encoder_service": ("EncoderService", "Ranked", "probability"),
    "engine.errors": (
        "BadSlotFile",
        "CheckpointError",
        "EngineError",
        "EngineStopped",
        "NoRoom",
        "QueueFull",
        "RequestError",
        "SlotBusy",
        "SlotError",
        "SlotFileMissing",
        "SlotFilesOff",
        "SlotWriteFailed",
        "StepFailed",
        "UnsupportedArchitecture",
        "check_token_ids",
    ),
    "engine.sampling.grammar": ("ANY_JSON_OBJECT", "JSON_OPTIONS", "Constraint"),
    "engine.sampling.params": ("GREEDY", "LLAMA_ORDER", "OPENAI_ORDER", "SAMPLERS", "SamplingParams"),
    "engine.sampling.reasoning_budget": ("BudgetSpec",),
    "engine.scheduling.request": ("Admitted", "Delta", "Failed", "Progress", "Request", "RequestEnd", "RequestEvent"),
    "engine.service": ("EngineService", "SlotInfo"),
    "engine.slot_files": ("MAX_NAME_CHARS", "NAME_PATTERN", "SlotFiles"),
    "engine.text.chat_template": ("ChatTemplate", "ChatTemplateError"),
    "engine.text.fim": ("FimTokens", "infill_prompt"),
    "engine.text.images": ("MAX_IMAGES", "BadImage", "ImageBudget", "ImagesBusy"),
    "engine.text.tokenizer": ("TokenizeError",),
}
_WHERE = {name: room for room, names in _ROOMS.items() for name in names}
__all__ = list(_WHERE)


def __getattr__(name: str):
    room = _WHERE.get(name)
    if room is None:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(room), name)
    globals()[name] = value  # asked once
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
