"""From a validated body to an engine request: sampling parameters and their defaults,
the token limit, the constraint, and prompts as token ids (server/pipeline/run.py runs it)."""

from __future__ import annotations

import asyncio
import dataclasses

from engine import BudgetSpec, Constraint, EngineService, Request, SamplingParams, check_token_ids
from server.errors import APIError
from server.pipeline.structured import constraint_of
from server.schemas.requests import SamplingFields
from server.schemas.sampler_fields import LLAMA_SAMPLING, OPENAI_SAMPLING, dry_breaker_texts, sampler_params
from server.state import ServerState

LLAMA_DEFAULTS = dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, **LLAMA_SAMPLING)  # llama-server's /completion
OPENAI_DEFAULTS = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, **OPENAI_SAMPLING)


async def build_request(
    state: ServerState,
    body: SamplingFields,
    ids: list[int],
    max_tokens: int | None,
    logprobs: int | None,
    defaults: dict,
    forced: tuple[str, str] | None = None,
    budget: BudgetSpec | None = None,
    preserved: frozenset[int] = frozenset(),
) -> Request:
    """The engine request of a validated body (every generating route builds it here):
    the token limit resolved, the structured-output constraint compiled (``forced``:
    (kind, source) of a constraint the route imposes, e.g. a required tool call), the
    sampling parameters completed from the server's and the route's defaults;
    ``preserved``: special tokens the answer's text keeps (a tool family's markers)."""
    engine = state.require_ready()
    n_tokens = resolve_max_tokens(max_tokens, state.settings.n_predict, len(ids), engine)
    constraint = await constraint_of(engine, body, forced) or state.default_constraint
    bias = await asyncio.to_thread(logit_bias, engine, body.logit_bias) if body.logit_bias else {}
    all_defaults = defaults | state.settings.sampling_defaults
    if state.settings.reverse_prompt:
        all_defaults["stop"] = (state.settings.reverse_prompt,)
    texts = dry_breaker_texts(body, all_defaults)  # found in the vocabulary once per set, off the event loop
    breakers = await asyncio.to_thread(engine.dry_breakers, texts) if texts else None
    params = sampling_params(body, n_tokens, logprobs, all_defaults, constraint, bias, breakers, budget)
    params = dataclasses.replace(params, preserved=preserved) if preserved else params
    n = getattr(body, "n", 1)
    s = state.settings
    cache_prompt = s.cache_prompt if body.cache_prompt is None else body.cache_prompt
    n_keep = s.keep if body.n_keep is None else body.n_keep
    lora = lora_scales(state, body.lora, getattr(body, "model", None))
    return Request(ids, params, n, body.id_slot, cache_prompt, n_keep, lora=lora)


def lora_scales(state: ServerState, given: list | None, model: str | None = None) -> tuple[float, ...]:
    """Each adapter's scale: the request's (unlisted: 0); else, where ``model`` names an
    adapter, that one at 1 and the others off (vLLM's LoRA by model name); else the
    server's (/lora-adapters)."""
    if given is None:
        names = state.lora_names
        if model is not None and model in names:
            return tuple(1.0 if name == model else 0.0 for name in names)
        return tuple(state.lora_scales)
    scales = [0.0] * len(state.lora_scales)
    for entry in given:
        if entry.id >= len(scales):
            raise APIError(400, f"lora: no adapter with id {entry.id} ({len(scales)} loaded)", code="invalid_lora")
        scales[entry.id] = entry.scale
    return tuple(scales)


def logit_bias(engine: EngineService, given: dict | list) -> dict[int, float]:
    """Each token's bias: ids as given, text on each of its tokens (llama-server's
    ``[["text", bias]]`` and ``{"text": bias}``), ``false`` as -inf (never sampled),
    ``true`` as no bias, ``"-inf"`` as a ban too. Raises RequestError for an id outside
    the vocabulary."""
    out: dict[int, float] = {}
    for key, value in given.items() if isinstance(given, dict) else given:
        if value is True:
            continue
        if isinstance(key, int) or key.isdigit():
            ids = [int(key)]
        else:
            ids = engine.tokenizer.encode(key, add_special=False) if key else []
        check_token_ids(ids, engine.vocab_size, "logit_bias")
        out.update(dict.fromkeys(ids, float("-inf") if value is False or value == "-inf" else float(value)))
    return out


def sampling_params(
    body: SamplingFields,
    max_tokens: int,
    logprobs: int | None,
    defaults: dict,
    constraint: Constraint | None = None,
    bias: dict[int, float] | None = None,
    breakers=None,
    budget: BudgetSpec | None = None,
) -> SamplingParams:
    pick = lambda name: defaults[name] if getattr(body, name) is None else getattr(body, name)  # noqa: E731
    given = lambda *names: next((v for v in (getattr(body, n, None) for n in names) if v is not None), None)  # noqa: E731
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=pick("temperature"),
            top_k=pick("top_k"),
            top_p=max(pick("top_p"), 1e-9),
            min_p=pick("min_p"),
            seed=_seed(body.seed if body.seed is not None else defaults.get("seed")),
            presence_penalty=_or(given("presence_penalty"), defaults.get("presence_penalty"), 0.0),
            frequency_penalty=_or(given("frequency_penalty"), defaults.get("frequency_penalty"), 0.0),
            repetition_penalty=_or(given("repetition_penalty", "repeat_penalty"), defaults.get("repeat_penalty"), 1.0),
            logit_bias=bias or {},
            logprobs=logprobs,
            stop=tuple([body.stop] if isinstance(body.stop, str) else body.stop or defaults.get("stop", ())),
            ignore_eos=body.ignore_eos,
            n_indent=body.n_indent,
            t_max_predict_ms=body.t_max_predict_ms,
            reasoning_budget=budget,
            spec_n_max=body.spec_n_max,
            spec_n_min=body.spec_n_min,
            spec_p_min=body.spec_p_min,
            constraint=constraint,
            **sampler_params(body, defaults, breakers),
        )
    except ValueError as exc:
        raise APIError(400, str(exc)) from exc


def _or(*values):
    return next(v for v in values if v is not None)


def _seed(seed: int | None) -> int | None:
    return None if seed in (None, -1) else seed


def resolve_max_tokens(requested: int | None, default: int, n_prompt: int, engine: EngineService) -> int:
    """The token limit; an open one runs to the end of the slot's context."""
    if requested is None and default >= 0:
        requested = default
    if requested is not None:
        return requested
    room = engine.n_ctx - n_prompt
    return 1 << 30 if engine.context_shift else max(room, 0)


def check_text_fits(engine: EngineService, n_chars: int) -> None:
    """Refuse at once a text that cannot fit the slot's context whatever its tokens
    (more characters than the context's tokens can hold), before spending CPU on it."""
    n_ctx = engine.n_ctx
    if n_chars > n_ctx * engine.tokenizer.max_token_chars:
        raise APIError(
            400,
            f"the prompt has {n_chars} characters: too large for a context of {n_ctx} tokens",
            "exceed_context_size_error",
            n_ctx=n_ctx,
        )


async def encode(engine: EngineService, text: str, add_special: bool = True) -> list[int]:
    """Token ids of ``text``, encoded in a worker thread (the event loop never waits on it)."""
    return await asyncio.to_thread(engine.tokenizer.encode, text, add_special)


async def decode(engine: EngineService, ids: list[int], skip_special: bool = True) -> str:
    return await asyncio.to_thread(engine.tokenizer.decode, ids, skip_special)


async def prompt_ids(engine: EngineService, prompt: str | list[int | str]) -> list[int]:
    """A generation prompt as token ids: text is checked against the context, then
    encoded; text pieces among ids (llama-server's mixed prompt) are encoded in place,
    the model's special tokens (BOS; an encoder's CLS and SEP) around a first piece that
    is text, as llama-server's ``tokenize_mixed`` adds them."""
    if isinstance(prompt, str):
        check_text_fits(engine, len(prompt))
        return await encode(engine, prompt)
    if any(isinstance(x, str) for x in prompt):
        check_text_fits(engine, sum(len(x) for x in prompt if isinstance(x, str)))
        pieces = [
            [x] if isinstance(x, int) else await encode(engine, x, add_special=k == 0) for k, x in enumerate(prompt)
        ]
        prompt = [t for piece in pieces for t in piece]
    check_token_ids(prompt, engine.vocab_size)
    return list(prompt)
