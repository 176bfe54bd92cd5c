"""The pooling a checkpoint asks for when it embeds: a sentence-transformers folder's
``*_Pooling/config.json`` (flags ``pooling_mode_*`` as published models carry them, or
sentence-transformers 6's ``pooling_mode`` by name), or a GGUF file's ``<arch>.pooling_type`` (llama.cpp's enum).
None when the checkpoint says nothing (the server then pools the last token). And the
leading lengths a Matryoshka model's embeddings may be cut to (``matryoshka_sizes``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

GGUF_POOLING = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}  # llama.cpp's llama_pooling_type
ST_POOLING = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean", "pooling_mode_lasttoken": "last"}


def checkpoint_pooling(model: str, gguf_fields: dict | None = None) -> str | None:
    if gguf_fields is not None:
        arch = gguf_fields.get("general.architecture")
        return GGUF_POOLING.get(gguf_fields.get(f"{arch}.pooling_type"))
    for path in sorted(Path(model).glob("*_Pooling/config.json")):
        try:
            cfg = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        if isinstance(cfg.get("pooling_mode"), str):  # sentence-transformers 6 writes the mode by name
            return {"mean": "mean", "cls": "cls", "lasttoken": "last"}.get(cfg["pooling_mode"])
        return next((mode for key, mode in ST_POOLING.items() if cfg.get(key)), None)
    return None


def matryoshka_sizes(raw: dict, size: int) -> Sequence[int] | None:
    """The leading lengths an embedding of ``size`` values may be cut to, from config.json
    (``raw``) as vLLM reads it: ``matryoshka_dimensions`` (those), or ``is_matryoshka``
    (any length up to ``size``); None: only the whole."""
    listed = raw.get("matryoshka_dimensions")
    if isinstance(listed, list) and listed and all(isinstance(d, int) and 0 < d <= size for d in listed):
        return tuple(sorted(set(listed)))
    return range(1, size + 1) if raw.get("is_matryoshka") is True else None
