"""DRY ("don't repeat yourself"), as llama.cpp defines it: a token that would extend a
repeat of the context's end by more than ``allowed_length`` tokens loses
``multiplier * base ** (length - allowed_length)`` from its logit. Repeats do not reach
back past a sequence breaker (newline, colon, quote, star by default: every token
sequence that writes one, engine/text/breakers.py), and a one-token breaker is never
penalized itself."""

from __future__ import annotations

import math

from engine.sampling.params import DryBreakers, SamplingParams

FLOAT_MAX_LOG = 88.7228391  # log of float32's largest value: the exponent stays below it


def _z_function(s: list[int]) -> list[int]:
    """z[k]: the length of the longest common prefix of s and s[k:] (z[0] = len(s))."""
    n = len(s)
    z = [0] * n
    if n:
        z[0] = n
    left = right = 0
    for k in range(1, n):
        if k < right:
            z[k] = min(right - k, z[k - left])
        while k + z[k] < n and s[z[k]] == s[k + z[k]]:
            z[k] += 1
        if k + z[k] > right:
            left, right = k, k + z[k]
    return z


def _repeat_limit(rev: list[int], breakers: DryBreakers) -> int:
    """How far back (in tokens, ``rev`` is the context backwards) a repeat may reach: to
    just after the latest complete breaker."""
    tails = breakers.tails
    for i, token in enumerate(rev):
        longest = -1
        for tail in tails.get(token, ()):
            n = len(tail)
            if longest < n <= i and all(tail[j] == rev[i - 1 - j] for j in range(n)):
                longest = n
        if longest >= 0:
            return i - longest
    return len(rev)


def dry_penalties(history: list[int], p: SamplingParams) -> dict[int, float]:
    """token -> the amount DRY subtracts from its logit, given the context so far."""
    window = history if p.dry_penalty_last_n < 0 else history[-p.dry_penalty_last_n :]
    n = len(window)
    if n <= p.dry_allowed_length:
        return {}
    rev = window[::-1]
    limit = _repeat_limit(rev, p.dry_breakers)
    if limit < p.dry_allowed_length:
        return {}
    z = _z_function(rev)  # z[k]: the context's end repeats, k tokens back, for this long
    longest: dict[int, int] = {}
    for k in range(1, n):
        length = min(z[k], limit)
        if length >= p.dry_allowed_length:
            token = window[n - k]  # what followed that earlier repeat
            longest[token] = max(longest.get(token, 0), length)
    single = p.dry_breakers.single
    max_exp = int(FLOAT_MAX_LOG / math.log(p.dry_base)) if p.dry_base > 1.000001 else 0
    out = {}
    for token, length in longest.items():
        if token in single:
            continue
        exp = length - p.dry_allowed_length
        if max_exp > 0:
            exp = min(exp, max_exp)
        out[token] = p.dry_multiplier * p.dry_base**exp
    return out
