"""One generation request as the engine tracks it (no tensors)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from engine.core.media import media_keys
from engine.core.pooling import Pooler
from engine.core.rope_switch import tagged
from engine.sampling.params import SamplingParams
from engine.sampling.reasoning_budget import ReasoningBudget
from engine.text.detokenizer import IncrementalDetokenizer, StopMatcher
from engine.text.indent_limit import IndentLimit


class FinishReason(enum.StrEnum):
    STOP = "stop"  # EOS or a stop string
    LENGTH = "length"  # max_tokens or the slot's context
    ABORT = "abort"  # cancelled by the caller


@dataclass(eq=False)
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]]


@dataclass(eq=False)
class Sequence:
    """Memory sequence ``seq_id`` holds the cache of ``tokens[:n_computed]`` at
    positions 0..n_computed-1. Generated tokens are appended to ``tokens``."""

    seq_id: int
    prompt_ids: list[int]
    params: SamplingParams
    seed: int
    detok: IncrementalDetokenizer
    stopper: StopMatcher
    n_computed: int = 0
    n_keep: int = 0  # tokens a context shift never drops
    n_shifted: int = 0  # tokens dropped by context shifts so far
    tokens: list[int] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    text: str = ""
    finish_reason: FinishReason | None = None
    stop_string: str | None = None
    matcher: object = None  # llguidance matcher following output_ids when constrained
    draft: list[int] = field(default_factory=list)  # this step's proposed tokens (engine/core/speculation.py)
    n_drafted: int = 0  # tokens proposed so far
    n_drafts: int = 0  # ... in this many proposals
    n_draft_accepted: int = 0  # ... of which the model picked the same
    draft_window: int = 0  # most tokens the next proposal may have (0: the server's most)
    mirostat_mu: float | None = None  # mirostat's state (None: not started)
    lora: tuple[float, ...] = ()  # each loaded LoRA adapter's scale for this sequence (missing: 0)
    pooler: Pooler | None = None  # an embedding: the prompt's hidden states are pooled, nothing is sampled
    indent: IndentLimit | None = None  # the request's n_indent (None: none)
    budget: ReasoningBudget | None = None  # the request's reasoning budget (None: none)
    first_token_at: float | None = None  # when the first token was accepted (acceptance.clock)
    media: list = field(default_factory=list)  # MediaItem (engine/core/media.py) of the prompt's images, in order
    turn_start: int | None = None  # where a chat prompt's generation prompt begins: checkpointed (see plan_step)
    rope_long: bool = False  # its rows turn by LongRoPE's long factors (engine/core/rope_switch.py)

    @property
    def keys(self) -> list[int]:
        """``tokens`` as prompts are compared (engine/core/media.py: images by their digest;
        engine/core/rope_switch.py: a long LongRoPE cache by other keys)."""
        return tagged(media_keys(self.tokens, self.media), self.rope_long)

    def __post_init__(self) -> None:
        if not self.tokens:
            self.tokens = list(self.prompt_ids)
        if self.params.n_indent > 0 and self.indent is None:
            self.indent = IndentLimit(self.params.n_indent)
        if self.params.reasoning_budget is not None and self.params.constraint is None and self.budget is None:
            self.budget = ReasoningBudget(self.params.reasoning_budget)  # (a grammar decides thinking itself)

    @property
    def n_pending(self) -> int:
        """Known tokens whose cache is not computed yet."""
        return len(self.tokens) - self.n_computed

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class StepEvent:
    """What one step produced for one sequence. ``error``: the step failed for this
    sequence alone (it has left the running set; its request fails, its cache is not
    to be trusted)."""

    seq: Sequence
    token_id: int | None  # None: a prefill chunk that sampled nothing
    text: str
    finished: bool
    logits: object = None  # [V] tensor when the step was asked to keep logits
    error: BaseException | None = None
    n_output: int = 0  # the sequence's output tokens with this one (a step may bring several)
    logprob: TokenLogprob | None = None  # this token's, when logprobs were asked for
    embedding: list[list[float]] | None = None  # an embedding sequence's result (Pooler.result)
