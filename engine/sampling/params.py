"""Per-request sampling and stopping parameters (validated once, then frozen)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.sampling.grammar import Constraint
    from engine.sampling.reasoning_budget import BudgetSpec


SAMPLERS = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature")
LLAMA_ORDER = SAMPLERS  # llama-server's default chain: temperature last
OPENAI_ORDER = ("penalties", "dry", "temperature", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc")


class DryBreakers:
    """DRY's sequence breakers as token sequences (engine/text/breakers.py), indexed by
    their first token once per breaker set, so each step only looks them up."""

    __slots__ = ("sequences", "single", "tails")

    def __init__(self, sequences: Iterable[tuple[int, ...]] = ()):
        self.sequences = tuple(dict.fromkeys(tuple(s) for s in sequences if s))
        tails: dict[int, list[tuple[int, ...]]] = {}
        for seq in self.sequences:
            tails.setdefault(seq[0], []).append(seq[1:])
        self.tails = {head: tuple(t) for head, t in tails.items()}  # first token -> the rests that may follow it
        self.single = frozenset(seq[0] for seq in self.sequences if len(seq) == 1)  # breakers of one token


@dataclass(frozen=True)
class SamplingParams:
    """``temperature == 0`` is greedy. ``top_k <= 0`` and ``top_p == 1`` and
    ``min_p == 0`` disable those filters. ``seed=None``: the engine draws one.
    ``logprobs``: None for none, n >= 0 for the chosen token plus n alternatives.

    llama-server's samplers (engine/sampling/chain.py): ``samplers`` is the chain's
    order (names of ``SAMPLERS``; one left out is not applied); ``repeat_last_n``: the
    penalties count the last n tokens of prompt and output (-1: all; None: vLLM's
    rule, repetition over prompt and output, presence and frequency over the output);
    DRY, top-n-sigma, typical-p, XTC, dynamic temperature and mirostat (1, 2: it
    replaces the chain after the temperature) with llama.cpp's meanings and defaults.
    ``post_sampling_probs``: logprobs are taken from the final distribution."""

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
    samplers: tuple[str, ...] = OPENAI_ORDER
    repeat_last_n: int | None = None
    top_n_sigma: float = -1.0  # keep logits within n standard deviations of the top one (<= 0: off)
    typical_p: float = 1.0  # locally typical sampling (1: off)
    xtc_probability: float = 0.0  # chance a step removes the top choices (0: off)
    xtc_threshold: float = 0.1  # ... those at least this likely, but the least likely of them (> 0.5: off)
    dynatemp_range: float = 0.0  # temperature in [t - range, t + range] by the distribution's entropy (0: off)
    dynatemp_exponent: float = 1.0
    mirostat: int = 0  # 1: mirostat, 2: mirostat 2.0 (0: off)
    mirostat_tau: float = 5.0  # target surprise (bits)
    mirostat_eta: float = 0.1  # learning rate
    dry_multiplier: float = 0.0  # DRY: penalty multiplier (0: off)
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1  # tokens scanned for repeats (-1: all, 0: off)
    dry_breakers: DryBreakers | tuple[tuple[int, ...], ...] = ()  # sequence breakers (token sequences)
    min_keep: int = 0  # truncating samplers keep at least this many tokens
    n_indent: int = 0  # lines after the first open with at least this many spaces/tabs (0: any)
    t_max_predict_ms: int = -1  # once this long after the first token, stop at a newline (<= 0: never)
    reasoning_budget: BudgetSpec | None = None  # tokens allowed in a thinking block (None: any)
    post_sampling_probs: bool = False
    preserved: frozenset[int] = frozenset()  # special tokens the answer's text keeps (a chat family's markers)

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
            (all(s in SAMPLERS for s in self.samplers), f"samplers must be among {', '.join(SAMPLERS)}"),
            (self.mirostat in (0, 1, 2), "mirostat must be 0, 1 or 2"),
            (0 <= self.xtc_probability <= 1 and 0 <= self.xtc_threshold <= 1, "xtc values must be in [0, 1]"),
            (self.dynatemp_range >= 0 and self.dynatemp_exponent >= 0, "dynatemp values must be >= 0"),
            (self.dry_base >= 1 and self.dry_allowed_length >= 0, "dry_base must be >= 1, dry_allowed_length >= 0"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        object.__setattr__(self, "stop", tuple([self.stop] if isinstance(self.stop, str) else self.stop))
        if not isinstance(self.dry_breakers, DryBreakers):
            object.__setattr__(self, "dry_breakers", DryBreakers(self.dry_breakers))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalized(self) -> bool:
        some = self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
        return bool(some) and "penalties" in self.samplers and self.repeat_last_n != 0 and not self.mirostat

    @property
    def dry(self) -> bool:
        return self.dry_multiplier > 0 and self.dry_penalty_last_n != 0 and "dry" in self.samplers and not self.mirostat


GREEDY = SamplingParams(temperature=0.0)
