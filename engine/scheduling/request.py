"""A request as the scheduler sees it, and the events it sends back (no tensors)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from engine.core.media import media_keys
from engine.core.rope_switch import tagged
from engine.core.sequence import TokenLogprob
from engine.sampling.params import SamplingParams


@dataclass(eq=False)
class Request:
    """``n`` choices of one prompt. ``id_slot``: pin the (first) choice to that slot.
    ``cache_prompt``: reuse a cached prefix. ``n_keep``: prompt tokens a context shift
    never drops. ``t_arrival``: when the server received it (``time.monotonic``)."""

    prompt_ids: list[int]
    params: SamplingParams
    n: int = 1
    id_slot: int | None = None
    cache_prompt: bool = True
    n_keep: int = 0
    progress: bool = False  # send Progress events while the prompt is computed
    pooling: str | None = None  # an embedding (engine/core/pooling.py): n is 1, nothing is sampled
    lora: tuple[float, ...] = ()  # each loaded LoRA adapter's scale (missing: 0)
    media: list = field(default_factory=list)  # the prompt's images (engine/core/media.py MediaItem), in order
    turn_start: int | None = None  # where a chat prompt's generation prompt begins (Engine.add_sequence)
    rope_long: bool = False  # its prompt is past a LongRoPE model's switch (set on submit)
    t_arrival: float = field(default_factory=time.monotonic)
    id: int = -1  # set by the scheduler

    @property
    def keys(self) -> list[int]:
        """The prompt as prompts are compared: images by their digest (engine/core/media.py)."""
        return tagged(media_keys(self.prompt_ids, self.media), self.rope_long)


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
    n_drafted: int = 0  # speculative decoding: tokens proposed for this choice so far
    n_draft_accepted: int = 0  # ... of which the model confirmed
    embedding: list[list[float]] | None = None  # an embedding request's pooled hidden states (unnormalized)


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


@dataclass(frozen=True)
class RequestEnd:
    """A submitted request ended, told on the engine thread before its last slot is
    released (so a slot seen idle means its request was counted). ``outcome``: stop or
    length (the first choice's reason), abort (cancelled, or the client left) or error.
    Times are ``time.monotonic`` values; None where the request never got that far."""

    outcome: str
    n_prompt: int
    n_cached: int
    n_generated: int
    t_arrival: float
    t_admit: float | None
    t_first: float | None
    t_end: float
    n_drafted: int = 0  # speculative decoding: tokens proposed over the request's choices
    n_draft_accepted: int = 0  # ... of which the model confirmed
    n_drafts: int = 0  # ... in this many proposals (each verified in one step)
