"""Sampling for a whole batch in one vectorized pass.

Order: logit_bias, repetition penalty, presence/frequency penalties -> logprobs are
taken here (the model's distribution after biases and penalties, before temperature
and truncation) -> greedy rows take the argmax; the others divide by temperature,
apply top_k, top_p and min_p on the sorted distribution, and pick by inverse CDF with a
uniform drawn from a counter-based hash of (seed, n_generated). That draw depends on
nothing but the request, so a seed gives the same tokens whatever else is in the batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from engine.sampling.params import SamplingParams

_M32 = 0xFFFFFFFF


class SampleRow(NamedTuple):
    params: SamplingParams
    seed: int
    prompt_ids: list[int]
    output_ids: list[int]


@dataclass
class SampleOutput:
    tokens: list[int]
    logprobs: list[float] | None = None  # chosen token's logprob per row
    top_ids: list[list[int]] | None = None  # [S][n]
    top_logprobs: list[list[float]] | None = None  # [S][n]


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (lowbias32) on int64 tensors holding values < 2**32."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def uniform(seeds: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """seeds, counters: [S] int64 -> [S] float64 in [0, 1), a pure function of its inputs."""
    lo, hi = seeds & _M32, (seeds >> 32) & _M32
    x = _mix32(lo ^ _mix32(hi ^ 0x9E3779B9))
    x = _mix32(x ^ _mix32(counters & _M32))
    return x.double() / 2.0**32


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


def _apply_penalties(logits: torch.Tensor, rows: list[SampleRow]) -> None:
    idx = [i for i, row in enumerate(rows) if row.params.penalized]
    if not idx:
        return
    vocab, dev = logits.shape[1], logits.device
    counts = torch.stack(
        [torch.bincount(torch.tensor(rows[i].output_ids, dtype=torch.long), minlength=vocab)[:vocab] for i in idx]
    ).to(dev, logits.dtype)  # [P, V]
    seen = (
        torch.stack(
            [torch.bincount(torch.tensor(rows[i].prompt_ids, dtype=torch.long), minlength=vocab)[:vocab] for i in idx]
        ).to(dev)
        > 0
    )
    seen |= counts > 0  # [P, V]
    p = [rows[i].params for i in idx]
    rep = torch.tensor([x.repetition_penalty for x in p], device=dev)[:, None]
    pres = torch.tensor([x.presence_penalty for x in p], device=dev)[:, None]
    freq = torch.tensor([x.frequency_penalty for x in p], device=dev)[:, None]
    sub = logits[idx]  # [P, V]
    sub = torch.where(seen, torch.where(sub > 0, sub / rep, sub * rep), sub)
    sub = sub - freq * counts - pres * (counts > 0).to(sub.dtype)
    logits[idx] = sub


def _truncate_and_draw(logits: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
    """logits: [R, V] of sampling rows -> chosen token ids [R]."""
    dev, vocab = logits.device, logits.shape[1]
    p = [r.params for r in rows]
    temp = torch.tensor([x.temperature for x in p], device=dev)[:, None]
    top_k = torch.tensor([min(x.top_k, vocab) if x.top_k > 0 else vocab for x in p], device=dev)[:, None]
    top_p = torch.tensor([x.top_p for x in p], device=dev)[:, None]
    min_p = torch.tensor([x.min_p for x in p], device=dev)[:, None]
    sorted_logits, order = (logits / temp).clamp_(-_FINITE, _FINITE).sort(dim=-1, descending=True)  # [R, V]
    rank = torch.arange(vocab, device=dev)[None, :]
    sorted_logits = sorted_logits.masked_fill(rank >= top_k, float("-inf"))
    probs = sorted_logits.softmax(dim=-1)  # [R, V]
    cum = probs.cumsum(dim=-1)
    keep = (cum - probs < top_p) & (probs >= min_p * probs[:, :1])
    keep[:, 0] = True
    probs = (probs * keep).double()
    cum = probs.cumsum(dim=-1)  # [R, V]
    seeds = torch.tensor([r.seed for r in rows], dtype=torch.long)
    counters = torch.tensor([len(r.output_ids) for r in rows], dtype=torch.long)
    target = uniform(seeds, counters).to(dev)[:, None] * cum[:, -1:]  # [R, 1]
    choice = torch.searchsorted(cum, target, right=True).clamp_(max=vocab - 1)  # [R, 1]
    return order.gather(1, choice).squeeze(1)


_FINITE = 1e30  # logits stay within +-this, so probabilities and logprobs are never NaN or infinite


def sample(logits: torch.Tensor, rows: list[SampleRow]) -> SampleOutput:
    """logits: [S, V] float32 -> one token per row. The caller's logits change only by
    clamping to finite values (so sampling them again, row by row, gives the same)."""
    if any(r.params.logit_bias or r.params.penalized for r in rows):
        logits = logits.clone()
    _apply_bias(logits, rows)
    _apply_penalties(logits, rows)
    logits.nan_to_num_(nan=-_FINITE).clamp_(-_FINITE, _FINITE)  # a tiny penalty divides to inf: keep it finite
    tokens = logits.argmax(dim=-1)  # [S]
    sampling = [i for i, r in enumerate(rows) if not r.params.greedy]
    out = SampleOutput(tokens=[])
    n_top = max((r.params.logprobs for r in rows if r.params.logprobs is not None), default=None)
    if n_top is not None:
        logprobs = logits.log_softmax(dim=-1)  # [S, V]
    if sampling:
        tokens[sampling] = _truncate_and_draw(logits[sampling], [rows[i] for i in sampling])
    if n_top is not None:
        out.logprobs = logprobs.gather(1, tokens[:, None]).squeeze(1).tolist()
        if n_top > 0:
            top_lp, top_ids = logprobs.topk(n_top, dim=-1)  # [S, n]
            out.top_ids, out.top_logprobs = top_ids.tolist(), top_lp.tolist()
    out.tokens = tokens.tolist()
    return out
