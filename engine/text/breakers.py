"""DRY's sequence breakers in a vocabulary, as llama.cpp finds them
(``get_overlapping_token_sequences``): a breaker string is written by many token
sequences, not only by the one its text tokenizes to.

- Every token whose text contains the breaker is a breaker of its own (``"\\n\\n"`` and
  ``".\\n"`` break a repeat as ``"\\n"`` does).
- A token whose text ends with the first part of the breaker starts one, followed by
  the tokens of the rest (the rest's text tokenized, at most ``MAX_TAIL`` tokens).

The breaker is cut to ``MAX_BYTES`` bytes first, as llama.cpp cuts it. A rest that
splits a UTF-8 character cannot be tokenized as text and is left out (llama.cpp
tokenizes the bytes)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

MAX_BYTES = 40  # llama.cpp's MAX_CHAR_LEN
MAX_TAIL = 20  # llama.cpp's MAX_SEQ_LEN


def overlapping_sequences(
    vocab: Sequence[bytes], encode: Callable[[str], list[int]], breaker: str
) -> list[tuple[int, ...]]:
    """(head token, *the tokens that follow it) for every way ``breaker`` can be written
    starting inside one token of ``vocab`` (each token's bytes, by id)."""
    s = breaker.encode("utf-8")[:MAX_BYTES]
    if not s:
        return []
    out: list[tuple[int, ...]] = []
    for token, word in enumerate(vocab):
        if s in word:
            out.append((token,))
            continue
        pos = word.find(s[:1])
        tails: list[tuple[int, ...]] = []
        while pos != -1:
            n = min(len(s), len(word) - pos)  # the word ends inside the breaker: its end must match
            if word[pos:] == s[:n]:
                try:
                    tail = tuple(encode(s[n:].decode("utf-8"))[:MAX_TAIL])
                except UnicodeDecodeError:
                    tail = ()
                if tail and tail not in tails:
                    tails.append(tail)
            pos = word.find(s[:1], pos + 1)
        out += [(token, *tail) for tail in tails]
    return out
