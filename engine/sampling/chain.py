"""The truncation-and-temperature chain of sampling rows, vectorized over the rows that
share one order (``SamplingParams.samplers``), and the draw.

Each row's logits are sorted once; every stage then only masks (-inf) or rescales
(temperature: order kept), so the array stays sorted among the tokens left and each
stage is a few tensor ops over [R, V]. Meanings follow llama.cpp's samplers: top-n-sigma
(max - n·std of the finite logits), top-k, typical-p, top-p, min-p (all keeping at
least ``min_keep``), XTC (with its own seeded draw), temperature with llama.cpp's
dynamic range. Mirostat 1/2 replace the chain after the temperature and carry ``mu``
from step to step. The draw is an inverse CDF at a uniform that depends only on
(seed, output length), so a seed gives the same tokens whatever else is in the batch."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from engine.sampling.params import SamplingParams
from engine.sampling.random import uniform

XTC_SALT = 0x5854435F  # XTC's draw: another stream of the same seed
Stage = Callable[[torch.Tensor, list[SamplingParams], list], torch.Tensor]


def _col(values: list, like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(values, dtype=like.dtype, device=like.device)[:, None]  # [R, 1]


def _row(values: list, like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """[R] on ``like``'s device: every stage's tensors live where the logits do (CUDA
    rejects a CPU operand), and whether a stage runs is decided from the parameters on
    the host, so no stage waits for the device."""
    return torch.tensor(values, dtype=dtype, device=like.device)


def _rank(s: torch.Tensor) -> torch.Tensor:
    """Each entry's rank among the row's tokens still in (masked ones do not count)."""
    return torch.isfinite(s).cumsum(-1) - 1  # [R, V]


def _probs(s: torch.Tensor) -> torch.Tensor:
    return s.softmax(-1)  # [R, V]; masked entries 0


def _mask(s: torch.Tensor, keep: torch.Tensor, on: torch.Tensor) -> torch.Tensor:
    """``keep`` [R, V] applied on the rows ``on`` [R] (the others unchanged)."""
    return s.masked_fill(~keep & on[:, None], float("-inf"))


def top_n_sigma(s, params, _):
    if not any(p.top_n_sigma > 0 for p in params):
        return s
    n = _row([p.top_n_sigma for p in params], s, s.dtype)
    on = n > 0
    finite = torch.isfinite(s)
    count = finite.sum(-1, keepdim=True).clamp(min=1)
    vals = torch.where(finite, s, 0.0)
    mean = vals.sum(-1, keepdim=True) / count
    std = (torch.where(finite, (s - mean) ** 2, 0.0).sum(-1, keepdim=True) / count).sqrt()
    top = torch.where(finite, s, float("-inf")).amax(-1, keepdim=True)
    return _mask(s, s >= top - n[:, None] * std, on & (count[:, 0] > 1))


def top_k(s, params, _):
    vocab = s.shape[1]
    k = [p.top_k if 0 < p.top_k < vocab else vocab for p in params]
    if all(x == vocab for x in k):
        return s
    return _mask(s, _rank(s) < _row(k, s)[:, None], _row([True] * len(params), s))


def _keep_at_least(keep: torch.Tensor, s: torch.Tensor, params) -> torch.Tensor:
    n = _row([max(p.min_keep, 1) for p in params], s)[:, None]
    return keep | (_rank(s) < n)


def typical_p(s, params, _):
    if not any(p.typical_p < 1 for p in params):
        return s
    on = _row([p.typical_p < 1 for p in params], s)
    probs = _probs(s)
    logp = torch.where(probs > 0, probs.log(), 0.0)
    entropy = -(probs * logp).sum(-1, keepdim=True)
    score = torch.where(probs > 0, (-logp - entropy).abs(), float("inf"))  # [R, V]
    by_score = score.argsort(dim=-1, stable=True)
    p_sorted = probs.gather(1, by_score)
    cum_before = p_sorted.cumsum(-1) - p_sorted
    typ = _col([p.typical_p for p in params], s)
    place = torch.arange(s.shape[1], device=s.device)[None, :]
    keep_sorted = (cum_before <= typ) | (place < _row([max(p.min_keep, 1) for p in params], s)[:, None])
    keep = torch.zeros_like(keep_sorted).scatter_(1, by_score, keep_sorted)
    return _mask(s, keep, on)


def top_p(s, params, _):
    if not any(p.top_p < 1 for p in params):
        return s
    on = _row([p.top_p < 1 for p in params], s)
    probs = _probs(s)
    keep = _keep_at_least(probs.cumsum(-1) - probs < _col([p.top_p for p in params], s), s, params)
    return _mask(s, keep, on)


def min_p(s, params, _):
    if not any(p.min_p > 0 for p in params):
        return s
    on = _row([p.min_p > 0 for p in params], s)
    probs = _probs(s)
    keep = _keep_at_least(probs >= _col([p.min_p for p in params], s) * probs.amax(-1, keepdim=True), s, params)
    return _mask(s, keep, on)


def xtc(s, params, rows):
    """With probability ``xtc_probability``: every token at least ``xtc_threshold``
    likely goes, but the least likely of them (when two or more are)."""
    wants = [p.xtc_probability > 0 and p.xtc_threshold <= 0.5 for p in params]
    if not any(wants):
        return s
    seeds = _row([r.seed ^ XTC_SALT for r in rows], s, torch.long)
    counters = _row([len(r.output_ids) for r in rows], s, torch.long)
    chance = uniform(seeds, counters)
    on = _row(wants, s) & (chance <= _row([p.xtc_probability for p in params], s, torch.float64))
    probs = _probs(s)
    n_above = (probs >= _col([p.xtc_threshold for p in params], s)).sum(-1, keepdim=True)  # a prefix: sorted
    n_left = torch.isfinite(s).sum(-1, keepdim=True) - (n_above - 1)
    min_keep = _row([p.min_keep for p in params], s)[:, None]
    cut = (n_above >= 2) & (n_left >= min_keep)
    return _mask(s, ~(cut & (_rank(s) < n_above - 1)), on)


def temperature(s, params, _):
    temp = _row([p.temperature for p in params], s, s.dtype)
    if any(p.dynatemp_range > 0 for p in params):
        ranged = _row([p.dynatemp_range > 0 for p in params], s)
        n = torch.isfinite(s).sum(-1)
        probs = _probs(s)
        entropy = -(probs * torch.where(probs > 0, probs.log(), 0.0)).sum(-1)
        norm = entropy / torch.log(n.clamp(min=2).to(s.dtype))
        spread = _row([p.dynatemp_range for p in params], s, s.dtype)
        exponent = _row([p.dynatemp_exponent for p in params], s, s.dtype)
        low, high = (temp - spread).clamp(min=0), temp + spread
        dynamic = low + (high - low) * norm.pow(exponent)
        temp = torch.where(ranged & (n > 1), dynamic, temp)
    cold = temp <= 0  # llama.cpp: the top token alone
    s = s / temp.clamp(min=1e-6)[:, None]
    return _mask(s, _rank(s) < 1, cold)  # no row cold: nothing masked (and no wait for the device)


STAGES: dict[str, Stage] = {
    "top_n_sigma": top_n_sigma,
    "top_k": top_k,
    "typ_p": typical_p,
    "top_p": top_p,
    "min_p": min_p,
    "xtc": xtc,
    "temperature": temperature,
}


def _draw(probs: torch.Tensor, rows) -> torch.Tensor:
    """probs: [R, V] (sorted order) -> the chosen position [R, 1] by inverse CDF."""
    cum = probs.double().cumsum(-1)
    seeds = _row([r.seed for r in rows], probs, torch.long)
    counters = _row([len(r.output_ids) for r in rows], probs, torch.long)
    target = uniform(seeds, counters)[:, None] * cum[:, -1:]  # [R, 1]
    return torch.searchsorted(cum, target, right=True).clamp_(max=probs.shape[1] - 1)


def run_chain(logits: torch.Tensor, rows) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[float | None]]:
    """logits [R, V] of rows sharing one order (or one mirostat version) -> (tokens [R],
    final probabilities [R, V] in sorted order, that order [R, V], each row's new mu)."""
    params = [r.params for r in rows]
    s, order = logits.sort(-1, descending=True)  # [R, V]
    if params[0].mirostat:
        s = temperature(s, params, rows)
        return _mirostat(s, order, rows)
    for name in params[0].samplers:
        if name in STAGES:
            s = STAGES[name](s, params, rows)
    probs = _probs(s)
    pick = _draw(probs, rows)
    return order.gather(1, pick).squeeze(1), probs, order, [None] * len(rows)


def _mirostat(s: torch.Tensor, order: torch.Tensor, rows):
    """Mirostat (1: top-k from the estimated Zipf exponent; 2: tokens less surprising
    than mu), then the draw; mu moves by eta times the surprise's distance to tau."""
    params = [r.params for r in rows]
    vocab = s.shape[1]
    mu = _row([r.mu if r.mu is not None else 2 * r.params.mirostat_tau for r in rows], s, torch.float64)
    probs = _probs(s).double()
    if params[0].mirostat == 1:
        m = min(100, vocab) - 1
        i = torch.arange(m, dtype=torch.float64, device=s.device)
        t = torch.log((i + 2) / (i + 1))  # [m]
        b = torch.log(probs[:, :m].clamp(min=1e-300) / probs[:, 1 : m + 1].clamp(min=1e-300))  # [R, m]
        s_hat = (t * b).sum(-1) / (t * t).sum()
        eps = s_hat - 1
        k = ((eps * 2.0**mu) / (1 - vocab ** (-eps))) ** (1 / s_hat)
        k = torch.nan_to_num(k, nan=1.0, posinf=float(vocab)).clamp(min=1, max=vocab).floor()
        keep = _rank(s) < k[:, None]
    else:
        keep = (-torch.log2(probs.clamp(min=1e-300)) <= mu[:, None]) | (_rank(s) < 1)
    s = s.masked_fill(~keep, float("-inf"))
    probs = _probs(s)
    pick = _draw(probs, rows)
    chosen = probs.double().gather(1, pick).squeeze(1)
    surprise = -torch.log2(chosen.clamp(min=1e-300))
    tau = _row([p.mirostat_tau for p in params], s, torch.float64)
    eta = _row([p.mirostat_eta for p in params], s, torch.float64)
    new_mu = (mu - eta * (surprise - tau)).tolist()
    return order.gather(1, pick).squeeze(1), probs, order, [float(x) if math.isfinite(x) else None for x in new_mu]
