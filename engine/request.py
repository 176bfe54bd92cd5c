"""A request as the scheduler sees it, and the events it sends back (no tensors)."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.sampling_params import SamplingParams
from engine.sequence import TokenLogprob


@dataclass(eq=False)
class Request:
    """``n`` choices of one prompt. ``id_slot``: pin the (first) choice to that slot.
    ``cache_prompt``: reuse a cached prefix. ``n_keep``: prompt tokens a context shift
    never drops. ``max_tokens_given``: False when the client left the limit open (the
    context check then covers the prompt only)."""

    prompt_ids: list[int]
    params: SamplingParams
    n: int = 1
    id_slot: int | None = None
    cache_prompt: bool = True
    n_keep: int = 0
    max_tokens_given: bool = True
    progress: bool = False  # send Progress events while the prompt is computed
    id: int = -1  # set by the scheduler


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


@dataclass
class Admitted:
    """The request got its slots; ``n_cached`` prompt tokens were reused."""

    id_slots: list[int]
    n_prompt: int
    n_cached: int
    t: float


@dataclass
class Delta:
    """One choice advanced: a sampled token and the text it completed (may be empty,
    or the final flush when ``finished``). ``token_id`` is None when a choice ends
    without a new token (max_tokens reached)."""

    index: int
    token_id: int | None
    text: str
    logprob: TokenLogprob | None
    finished: bool
    t: float
    finish_reason: str | None = None
    stop_word: str | None = None
    n_generated: int = 0
    truncated: bool = False  # a context shift dropped tokens of this choice


@dataclass
class Progress:
    """The prompt of choice 0 advanced: ``n_processed`` of ``n_total`` tokens hold a
    cache (``n_cached`` of them were reused). Only for requests with ``progress``."""

    n_total: int
    n_cached: int
    n_processed: int
    t: float


@dataclass
class Failed:
    """The request ended with a server-side error (no more events follow)."""

    message: str
    type: str = "server_error"
    status: int = 500
    extra: dict = field(default_factory=dict)


RequestEvent = Admitted | Progress | Delta | Failed
