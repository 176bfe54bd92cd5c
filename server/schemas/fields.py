"""The building blocks of request bodies: the strict base model, bounded integers, and
the field types shared by several bodies (token ids, slots, non-empty text)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, Strict


class _Body(BaseModel):
    """Strict types (a string is never taken for a number), unknown fields ignored.
    Every constraint the server enforces on a body's shape is stated here, so the
    OpenAPI document says exactly what is accepted. Limits that depend on the model
    or the settings (vocabulary, slots) carry an ``x-limit`` mark that server/schemas/openapi.py
    turns into numbers; the routes enforce the same limits."""

    model_config = ConfigDict(extra="ignore", strict=True)


def _limit(name: str) -> dict:
    return {"json_schema_extra": {"x-limit": name}}


def _integral(v):
    """JSON Schema counts 5.0 as an integer: take it as 5 (strict mode refuses floats)."""
    return int(v) if isinstance(v, float) and v.is_integer() else v


# the bound of every integer: within int64, and a round decimal that a double holds exactly, so no
# number a client prints from a double in range (17 significant digits) lands past it
INT64 = 10**18


def Int(**constraints):  # noqa: N802 (a type)
    """An integer field with its constraints (before the validator, so the JSON schema
    states them), taking integral floats too. Every one is bounded (int64 unless the
    field says less): a larger number is a 400 naming the field, never an overflow
    deep in the engine."""
    constraints.setdefault("ge", -INT64)
    constraints.setdefault("le", INT64)
    return Annotated[int, Field(**constraints), BeforeValidator(_integral)]


TokenId = Int(ge=0, **_limit("token"))  # < the vocabulary size
EmbedSize = Int(ge=1, **_limit("n_embd"))  # = the model's hidden size
TokenIds = Annotated[list[TokenId], Field(min_length=1)]
NonEmpty = Annotated[str, Field(min_length=1)]
SlotId = Int(ge=-1, description="a slot (-1: any)", **_limit("slot"))
Bias = Annotated[float, Field(ge=-100, le=100)] | bool | Literal["-inf"]  # false or "-inf": never this token
BiasPair = Annotated[tuple[TokenId | str, Bias], Strict(False)]  # a JSON array is a list: let it be the pair


def text_only(kind: str) -> str:
    """How every route refuses a media part (``kind``: image, audio, document, ...), in
    llama-server's words for a model without a projector."""
    return f"{kind} input is not supported: this server takes text only"
