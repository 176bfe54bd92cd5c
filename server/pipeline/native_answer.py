"""llama-server's /completion answer shapes: the final object (with
``generation_settings``, ``completion_probabilities`` and ``response_fields``), the
stream frames and the prompt-progress frames."""

from __future__ import annotations

import json
import math

from engine import Delta, Progress
from server.pipeline.run import Run
from server.schemas.requests import NativeCompletionRequest


def stop_type(reason: str | None, stop_word: str | None) -> str:
    if reason == "length":
        return "limit"
    if reason == "stop":
        return "word" if stop_word else "eos"
    return "none"


class NativeAnswer:
    """llama-server's answer shapes: the final object, stream frames, progress."""

    def __init__(self, state, body: NativeCompletionRequest, engine):
        self.state, self.body, self.engine = state, body, engine

    def final(self, run: Run, index: int, stream: bool = False) -> dict:
        body = self.body
        out = native_final(self.state, self.engine, run, index, stream)
        if body.n_probs and not stream:
            lps = run.choices[0].logprobs
            out["completion_probabilities"] = token_probs(self.engine, lps, body.post_sampling_probs)
        return select_fields(out, body.response_fields) if body.response_fields else out

    def frame(self, run: Run, index: int, event) -> dict | None:
        id_slot = run.admitted.id_slots[0]
        if isinstance(event, Progress):
            out = {
                "index": index,
                "content": "",
                "tokens": [],
                "id_slot": id_slot,
                "stop": False,
                "prompt_progress": run.progress(event),
            }
            return {**out, "timings": run.progress_timings(event)} if self.body.timings_per_token else out
        if not isinstance(event, Delta):
            return None
        tokens = [event.token_id] if event.token_id is not None else []
        if event.finished:
            return {**self.final(run, index, stream=True), "content": event.text, "tokens": tokens}
        out = {"index": index, "content": event.text, "tokens": tokens, "id_slot": id_slot, "stop": False}
        if self.body.n_probs and event.logprob is not None:
            out["completion_probabilities"] = token_probs(self.engine, [event.logprob], self.body.post_sampling_probs)
        if self.body.timings_per_token:
            out["timings"] = run.timings()
        return out


def token_probs(engine, lps, post_sampling: bool = False) -> list[dict]:
    """llama-server's ``completion_probabilities``: each token with its bytes, and its
    log probability (``post_sampling_probs``: its probability after the sampling chain,
    as ``prob`` and ``top_probs``)."""
    tok = engine.tokenizer

    def entry(token_id: int, logprob: float) -> dict:
        piece = tok.decode([token_id], skip_special=False)
        value = {"prob": math.exp(logprob)} if post_sampling else {"logprob": logprob}
        return {"id": token_id, "token": piece, "bytes": list(tok.token_bytes(token_id)), **value}

    top = "top_probs" if post_sampling else "top_logprobs"
    return [{**entry(lp.token_id, lp.logprob), top: [entry(t, v) for t, v in lp.top]} for lp in lps]


def native_final(state, engine, run: Run, index: int = 0, stream: bool = False) -> dict:
    """llama-server's native final answer for ``run``'s first choice."""
    c = run.choices[0]
    return {
        "index": index,
        "content": "" if stream else c.text,
        "tokens": [] if stream else c.token_ids,
        "id_slot": run.admitted.id_slots[0],
        "stop": True,
        "model": state.settings.model_name,
        "tokens_predicted": len(c.token_ids),
        "tokens_evaluated": len(run.req.prompt_ids),
        "tokens_cached": run.admitted.n_cached,
        "stop_type": stop_type(c.finish_reason, c.stop_word),
        "stopping_word": c.stop_word or "",
        "truncated": c.truncated,
        "timings": run.timings(),
        "generation_settings": generation_settings(run.req.params, engine.tokenizer.eos_ids),
    }


def verbose_answer(state, engine, run: Run) -> dict:
    """What llama-server adds as ``__verbose`` to an OpenAI answer when verbose: its
    native answer, with the prompt as text (special tokens written out)."""
    prompt = engine.tokenizer.decode(run.req.prompt_ids, skip_special=False)
    return {**native_final(state, engine, run), "prompt": prompt, "has_new_line": "\n" in run.choices[0].text}


SAMPLER_NAMES = ("repeat_last_n", "top_n_sigma", "typical_p", "xtc_probability", "xtc_threshold", "dynatemp_range",
                 "dynatemp_exponent", "mirostat", "mirostat_tau", "mirostat_eta", "dry_multiplier", "dry_base",
                 "dry_allowed_length", "dry_penalty_last_n", "min_keep", "post_sampling_probs")  # fmt: skip


def generation_settings(params, eos_ids) -> dict:
    """The sampling settings a request ran with, in llama-server's names. ``logit_bias``
    lists [token, bias] pairs, ``false`` for a banned token; ``ignore_eos`` bans EOS as
    llama-server does (it shows there)."""
    bias = {t: (False if b == float("-inf") else b) for t, b in params.logit_bias.items()}
    if params.ignore_eos:
        bias.update(dict.fromkeys(sorted(eos_ids), False))
    constraint = params.constraint
    return {
        "n_predict": params.max_tokens,
        "seed": params.seed,
        "temperature": params.temperature,
        "top_k": params.top_k,
        "top_p": params.top_p,
        "min_p": params.min_p,
        "presence_penalty": params.presence_penalty,
        "frequency_penalty": params.frequency_penalty,
        "repeat_penalty": params.repetition_penalty,
        "stop": list(params.stop),
        "ignore_eos": params.ignore_eos,
        "n_probs": params.logprobs or 0,
        "logit_bias": [[t, b] for t, b in bias.items()],
        "grammar": constraint.source if constraint and constraint.kind in ("gbnf", "lark") else "",
        "json_schema": json.loads(constraint.source) if constraint and constraint.kind == "json_schema" else {},
        **{name: getattr(params, name) for name in SAMPLER_NAMES},
        "samplers": list(params.samplers),
        "speculative.n_max": params.spec_n_max,
        "speculative.n_min": params.spec_n_min,
        "speculative.p_min": params.spec_p_min,
    }


def select_fields(answer: dict, fields: list[str]) -> dict:
    """llama-server's ``response_fields``: only the named fields; a path with slashes
    reaches into nested objects and the value moves to the top under the whole path.
    Missing fields are left out."""
    out = {}
    for path in fields:
        node = answer
        for key in path.split("/"):
            if not isinstance(node, dict) or key not in node:
                break
            node = node[key]
        else:
            out[path] = node
    return out
