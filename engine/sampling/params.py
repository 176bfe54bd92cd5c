"""Per-request sampling and stopping parameters (validated once, then frozen)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.sampling.grammar import Constraint


@dataclass(frozen=True)
class SamplingParams:
    """``temperature == 0`` is greedy. ``top_k <= 0`` and ``top_p == 1`` and
    ``min_p == 0`` disable those filters. ``seed=None``: the engine draws one.
    ``logprobs``: None for none, n >= 0 for the chosen token plus n alternatives."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    logprobs: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    spec_n_max: int | None = None  # speculative decoding: most tokens proposed a step (None: the server's)
    spec_n_min: int | None = None  # ... shorter proposals are dropped (None: the server's)
    spec_p_min: float | None = None  # a draft model's guess less likely than this ends a proposal (None: the server's)
    constraint: Constraint | None = None  # structured output (engine.grammar), checked

    def __post_init__(self) -> None:
        checks = [
            (self.max_tokens >= 0, "max_tokens must be >= 0"),
            (self.temperature >= 0, "temperature must be >= 0"),
            (0 < self.top_p <= 1, "top_p must be in (0, 1]"),
            (0 <= self.min_p <= 1, "min_p must be in [0, 1]"),
            (-2 <= self.presence_penalty <= 2, "presence_penalty must be in [-2, 2]"),
            (-2 <= self.frequency_penalty <= 2, "frequency_penalty must be in [-2, 2]"),
            (self.repetition_penalty > 0, "repetition_penalty must be > 0"),
            (self.logprobs is None or 0 <= self.logprobs <= 20, "logprobs must be in [0, 20]"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        object.__setattr__(self, "stop", tuple([self.stop] if isinstance(self.stop, str) else self.stop))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalized(self) -> bool:
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0)


GREEDY = SamplingParams(temperature=0.0)
