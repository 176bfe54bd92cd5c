"""llama-server's sampler fields of a generating request (DRY, XTC, typical-p,
top-n-sigma, dynamic temperature, mirostat, ``samplers`` order, ``repeat_last_n``,
``post_sampling_probs``), and the engine parameters they become. Server-wide defaults
come from the flags of the same names (server/config/sampler_settings.py), then the route's
(llama-server's chain on its native routes, OpenAI's order on /v1)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from engine import LLAMA_ORDER, OPENAI_ORDER, SAMPLERS
from server.schemas.fields import Int, NonEmpty, _Body

DRY_BREAKERS = ("\n", ":", '"', "*")  # llama-server's default sequence breakers
ALIASES = {  # llama.cpp's other spellings of the chain's names
    **{name.replace("_", "-"): name for name in SAMPLERS},
    **{name.replace("_", ""): name for name in SAMPLERS},
    "nucleus": "top_p",
    "temp": "temperature",
    "typ": "typ_p",
    "typical_p": "typ_p",
}
CHARS = {"e": "penalties", "d": "dry", "s": "top_n_sigma", "k": "top_k", "y": "typ_p", "p": "top_p", "m": "min_p",
         "x": "xtc", "t": "temperature"}  # fmt: skip
LLAMA_SAMPLING = {"samplers": LLAMA_ORDER, "repeat_last_n": 64}  # llama-server's, on its native routes
OPENAI_SAMPLING = {"samplers": OPENAI_ORDER, "repeat_last_n": None}  # OpenAI's and vLLM's meaning on /v1


def sampler_order(given: list[str] | str) -> tuple[str, ...]:
    """A ``samplers`` value (names, llama.cpp's aliases, or a string of its one-letter
    codes) as the chain's names; unknown names are left out, as llama-server does."""
    if isinstance(given, str):
        return tuple(CHARS[c] for c in given if c in CHARS)
    names = (ALIASES.get(n.lower(), n.lower()) for n in given)
    return tuple(n for n in names if n in SAMPLERS)


class SamplerFields(_Body):
    """llama-server's sampler fields (every generating route takes them)."""

    samplers: list[str] | str | None = Field(
        None, description="the chain's order: names (top_k, typ_p, ...) or llama.cpp's letters (e.g. 'kpt')"
    )
    repeat_last_n: Int(ge=-1) | None = Field(None, description="penalties count the last n tokens (-1: all, 0: off)")
    repeat_penalty: float | None = Field(None, gt=0, le=100, description="llama-server's name for repetition_penalty")
    top_n_sigma: float | None = Field(None, le=1e6, description="keep logits within n std of the top (<= 0: off)")
    typical_p: float | None = Field(None, ge=0, le=1, description="locally typical sampling (1: off)")
    xtc_probability: float | None = Field(None, ge=0, le=1)
    xtc_threshold: float | None = Field(None, ge=0, le=1)
    dynatemp_range: float | None = Field(None, ge=0, le=100)
    dynatemp_exponent: float | None = Field(None, ge=0, le=100)
    mirostat: Int(ge=0, le=2) | None = None
    mirostat_tau: float | None = Field(None, ge=0, le=100)
    mirostat_eta: float | None = Field(None, ge=0, le=1)
    dry_multiplier: float | None = Field(None, ge=0, le=100)
    dry_base: float | None = Field(None, ge=0, le=100, description="below 1: the default (1.75), as llama-server")
    dry_allowed_length: Int(ge=0, le=2**31 - 1) | None = None
    dry_penalty_last_n: Int(ge=-1, le=2**31 - 1) | None = None
    dry_sequence_breakers: Annotated[list[NonEmpty], Field(min_length=1, max_length=64)] | None = None
    min_keep: Int(ge=0, le=2**31 - 1) | None = None
    post_sampling_probs: bool = False


def _picker(body: SamplerFields, defaults: dict):
    def pick(name: str, default=None):
        value = getattr(body, name)
        return value if value is not None else defaults.get(name, default)

    return pick


def dry_breaker_texts(body: SamplerFields, defaults: dict) -> tuple[str, ...] | None:
    """The DRY sequence breakers a request samples with (None: DRY is off)."""
    pick = _picker(body, defaults)
    if not pick("dry_multiplier", 0) > 0:
        return None
    breakers = pick("dry_sequence_breakers")
    return tuple(DRY_BREAKERS if breakers is None else breakers)


def sampler_params(body: SamplerFields, defaults: dict, breakers=None) -> dict:
    """The SamplingParams fields of llama-server's samplers: the request's value, else
    the server's (``defaults``), else the engine's. ``breakers``: the DRY breakers of
    ``dry_breaker_texts`` as token sequences (engine ``dry_breakers``)."""
    pick = _picker(body, defaults)

    order = body.samplers if body.samplers is not None else defaults.get("samplers")
    out = {
        "samplers": sampler_order(order) if isinstance(order, list | str) else order or OPENAI_ORDER,
        "repeat_last_n": pick("repeat_last_n"),
        "post_sampling_probs": body.post_sampling_probs,
    }
    for name in ("top_n_sigma", "typical_p", "xtc_probability", "xtc_threshold", "dynatemp_range",
                 "dynatemp_exponent", "mirostat", "mirostat_tau", "mirostat_eta", "dry_multiplier",
                 "dry_allowed_length", "dry_penalty_last_n", "min_keep"):  # fmt: skip
        value = pick(name)
        if value is not None:
            out[name] = value
    base = pick("dry_base")
    if base is not None:
        out["dry_base"] = base if base >= 1 else 1.75
    if out.get("dry_multiplier", 0) > 0:
        out["dry_breakers"] = breakers if breakers is not None else ()
        out.setdefault("dry_penalty_last_n", 64)
    return out
