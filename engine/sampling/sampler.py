"""Sampling for a whole batch in one vectorized pass.

Order: logit_bias, penalties (repetition, presence, frequency; over llama-server's
``repeat_last_n`` window when set), DRY -> logprobs are taken here (the model's
distribution after biases and penalties, before temperature and truncation) -> greedy
rows take the argmax; the others run their chain (engine/sampling/chain.py: top-n-sigma,
top-k, typical-p, top-p, min-p, XTC and temperature in the request's order, or
mirostat) and pick by inverse CDF with a uniform drawn from a counter-based hash of
(seed, n_generated). That draw depends on nothing but the request, so a seed gives the
same tokens whatever else is in the batch. Rows with ``post_sampling_probs`` report the
final distribution instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from engine.kernels.pick import finite_argmax
from engine.sampling.chain import run_chain
from engine.sampling.dry import dry_penalties
from engine.sampling.params import SamplingParams
from engine.sampling.random import uniform

__all__ = ["SampleOutput", "SampleRow", "sample", "uniform"]


class SampleRow(NamedTuple):
    params: SamplingParams
    seed: int
    prompt_ids: list[int]
    output_ids: list[int]
    mu: float | None = None  # mirostat's state before this token (None: 2 tau, its start)


@dataclass
class SampleOutput:
    tokens: list[int]
    logprobs: list[float] | None = None  # chosen token's logprob per row
    top_ids: list[list[int]] | None = None  # [S][n]
    top_logprobs: list[list[float]] | None = None  # [S][n]
    mu: list[float | None] | None = None  # mirostat rows: the state after this token


def _apply_bias(logits: torch.Tensor, rows: list[SampleRow]) -> None:
    r, c, v = [], [], []
    for i, row in enumerate(rows):
        for tok, bias in row.params.logit_bias.items():
            if 0 <= tok < logits.shape[1]:
                r.append(i), c.append(tok), v.append(bias)
    if r:
        dev = logits.device
        index = (torch.tensor(r, device=dev), torch.tensor(c, device=dev))
        logits.index_put_(index, torch.tensor(v, dtype=logits.dtype, device=dev), accumulate=True)


def _counts(ids: list[int], vocab: int) -> torch.Tensor:
    return torch.bincount(torch.tensor(ids, dtype=torch.long), minlength=vocab)[:vocab]


def _penalty_counts(row: SampleRow, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(counts for frequency/presence, seen for repetition) [V] each: llama-server's
    window of the last ``repeat_last_n`` tokens, or vLLM's rule without one."""
    n = row.params.repeat_last_n
    if n is None:
        counts = _counts(row.output_ids, vocab)
        return counts, (_counts(row.prompt_ids, vocab) > 0) | (counts > 0)
    history = row.prompt_ids + row.output_ids
    counts = _counts(history if n < 0 else history[-n:], vocab)
    return counts, counts > 0


def _apply_penalties(logits: torch.Tensor, rows: list[SampleRow]) -> None:
    idx = [i for i, row in enumerate(rows) if row.params.penalized]
    if not idx:
        return
    vocab, dev = logits.shape[1], logits.device
    pairs = [_penalty_counts(rows[i], vocab) for i in idx]
    counts = torch.stack([c for c, _ in pairs]).to(dev, logits.dtype)  # [P, V]
    seen = torch.stack([s for _, s in pairs]).to(dev)  # [P, V]
    p = [rows[i].params for i in idx]
    rep = torch.tensor([x.repetition_penalty for x in p], device=dev)[:, None]
    pres = torch.tensor([x.presence_penalty for x in p], device=dev)[:, None]
    freq = torch.tensor([x.frequency_penalty for x in p], device=dev)[:, None]
    sub = logits[idx]  # [P, V]
    sub = torch.where(seen, torch.where(sub > 0, sub / rep, sub * rep), sub)
    sub = sub - freq * counts - pres * (counts > 0).to(sub.dtype)
    logits[idx] = sub


def _apply_dry(logits: torch.Tensor, rows: list[SampleRow]) -> None:
    for i, row in enumerate(rows):
        if row.params.dry:
            for tok, penalty in dry_penalties(row.prompt_ids + row.output_ids, row.params).items():
                if 0 <= tok < logits.shape[1]:
                    logits[i, tok] -= penalty


_FINITE = 1e30  # logits stay within +-this, so probabilities and logprobs are never NaN or infinite


def _groups(rows: list[SampleRow], which: list[int]) -> dict[tuple, list[int]]:
    """Sampling rows by what their chain is (one vectorized pass each)."""
    out: dict[tuple, list[int]] = {}
    for i in which:
        p = rows[i].params
        out.setdefault((p.mirostat, () if p.mirostat else p.samplers), []).append(i)
    return out


def host_list(tokens: torch.Tensor) -> list[int]:
    """A device's chosen tokens [S] as a list: one non-blocking copy into pinned memory,
    then a wait for that copy alone (the step's one device-to-host transfer)."""
    if tokens.device.type == "cpu":
        return tokens.tolist()
    pinned = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
    pinned.copy_(tokens, non_blocking=True)
    done = torch.cuda.Event()
    done.record()
    done.synchronize()
    return pinned.tolist()


def sample(logits: torch.Tensor, rows: list[SampleRow]) -> SampleOutput:
    """logits: [S, V] float32 -> one token per row. The caller's logits change only by
    clamping to finite values (so sampling them again, row by row, gives the same)."""
    if any(r.params.logit_bias or r.params.penalized or r.params.dry for r in rows):
        logits = logits.clone()
    _apply_bias(logits, rows)
    _apply_penalties(logits, rows)
    _apply_dry(logits, rows)
    tokens = finite_argmax(logits, _FINITE)  # one compiled pass where built
    if tokens is None:
        logits.nan_to_num_(nan=-_FINITE).clamp_(-_FINITE, _FINITE)  # a tiny penalty divides to inf: keep it finite
        tokens = logits.argmax(dim=-1)  # [S]
    out = SampleOutput(tokens=[])
    n_top = max((r.params.logprobs for r in rows if r.params.logprobs is not None), default=None)
    if n_top is not None:
        logprobs = logits.log_softmax(dim=-1)  # [S, V]
    finals: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # row -> (final probs, order), sorted
    mu: list[float | None] = [None] * len(rows)
    sampling = [i for i, r in enumerate(rows) if not r.params.greedy]
    for idx in _groups(rows, sampling).values():
        chosen, probs, order, new_mu = run_chain(logits[idx], [rows[i] for i in idx])
        tokens[idx] = chosen.to(tokens.device)
        for j, i in enumerate(idx):
            mu[i] = new_mu[j]
            if rows[i].params.post_sampling_probs:
                finals[i] = (probs[j], order[j])
    out.tokens = host_list(tokens)
    if any(r.params.mirostat for r in rows):
        out.mu = mu
    if n_top is not None:
        out.logprobs = logprobs.gather(1, tokens[:, None]).squeeze(1).tolist()
        if n_top > 0:
            top_lp, top_ids = logprobs.topk(n_top, dim=-1)  # [S, n]
            out.top_ids, out.top_logprobs = top_ids.tolist(), top_lp.tolist()
        _post_sampling(out, rows, finals, n_top)
    return out


def _post_sampling(out: SampleOutput, rows: list[SampleRow], finals: dict, n_top: int) -> None:
    """Rows with ``post_sampling_probs``: the chosen token's and the top tokens' log
    probabilities in the final distribution (greedy rows: the top token alone, certain)."""
    for i, row in enumerate(rows):
        if not row.params.post_sampling_probs or row.params.logprobs is None:
            continue
        tok = out.tokens[i]
        if i not in finals:  # greedy: the chain leaves the top token alone
            out.logprobs[i] = 0.0
            if n_top > 0:
                out.top_ids[i], out.top_logprobs[i] = [tok], [0.0]
            continue
        probs, order = finals[i]  # [V] each, sorted
        n_left = int((probs > 0).sum())
        place = (order == tok).nonzero()[0, 0]
        out.logprobs[i] = float(probs[place].clamp(min=1e-45).log())
        if n_top > 0:
            k = min(n_top, n_left)
            out.top_ids[i] = order[:k].tolist()
            out.top_logprobs[i] = probs[:k].clamp(min=1e-45).log().tolist()
