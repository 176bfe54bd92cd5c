"""LongRoPE's switch (Phi-3, Phi-4-mini: engine/models/rope.py), as transformers makes it:
a sequence's rows turn by the short factors while the sequence is no longer than the
model's original context, and by the long ones once it is. A prompt longer than that
runs long from the start; a sequence that grows past it during generation computes
itself again, every row by the long factors (transformers' Phi-3 drops its cache at that
token), before its next token.

Which factors turned a cache is part of what the cache is: a long sequence's keys for
prefix comparison are its tokens offset by ``LONG``, so a short prompt never reuses a
long cache, nor the other way round (slots, the prompt cache and shared prefixes alike)."""

from __future__ import annotations

LONG = 1 << 40  # added to a long sequence's token keys (images' keys, negative, stay as they are)


def switch_of(model) -> int | None:
    """The original context where the model's rotary switches (None: no switch)."""
    return getattr(getattr(model, "rotary", None), "switch_at", None)


def tagged(keys: list[int], long: bool) -> list[int]:
    """``keys`` as a cache turned by the long factors is named (unchanged for a short one)."""
    return [k + LONG if k >= 0 else k for k in keys] if long else keys


def untagged(keys: list[int]) -> list[int]:
    """Keys back to token ids (what slot files hold)."""
    return [k - LONG if k >= LONG else k for k in keys]


def restored_keys(tokens: list[int], switch: int | None) -> list[int]:
    """A restored cache's keys: rows past the switch were only ever computed long, so a
    cache longer than it is long (one no longer than it is taken as short)."""
    return tagged(tokens, switch is not None and len(tokens) > switch)


def switch_crossed(memory, running: list, switch: int | None) -> None:
    """Sequences about to grow past ``switch`` with rows computed short: their cache goes,
    they run long from position 0 (their known tokens as a prompt; the chunk that reaches
    the end samples the next token as before)."""
    if switch is None:
        return
    for seq in running:
        if not seq.rope_long and len(seq.tokens) + len(seq.draft) > switch:
            seq.rope_long = True
            if seq.n_computed:
                memory.seq_rm(seq.seq_id)
                seq.n_computed = 0
                seq.draft.clear()
