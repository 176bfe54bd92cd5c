"""Structured outputs through llguidance: a constraint (GBNF, Lark, JSON schema, regex
or a choice of strings) is compiled and checked once per request, before anything is
queued; each constrained sequence then owns a matcher that follows its tokens, and the
token masks of a step's constrained rows are computed in a worker thread while the
forward runs, so unconstrained rows never wait on them.

Why llguidance (measured in ``bench/grammar_bench.py``, see docs/benchmarks.md): it
takes GBNF, Lark, JSON schema and regex with no runtime dependency, computes a mask in
tens of microseconds, and is what llama.cpp's optional grammar engine uses. xgrammar
needs ``transformers`` and ``triton`` at run time; outlines-core has no GBNF.
"""

from __future__ import annotations

import json
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import llguidance as llg
import torch

from engine.errors import RequestError
from engine.instance_cache import instance_cache
from engine.text.tokenizer import Tokenizer

KINDS = ("gbnf", "lark", "json_schema", "regex", "choice")
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
ANY_JSON_OBJECT = {"type": "object"}


@dataclass(frozen=True)
class Constraint:
    """A checked llguidance grammar. ``kind``/``source``: what the client gave."""

    kind: str
    source: str
    grammar: str


class GrammarCompiler:
    """Compiles constraints for one tokenizer (thread-safe; results are cached)."""

    def __init__(self, tokenizer: Tokenizer, n_vocab: int):
        self._tokenizer, self.n_vocab = tokenizer, n_vocab
        self._lock = threading.Lock()
        self._lltok: llg.LLTokenizer | None = None

    @property
    def lltok(self) -> llg.LLTokenizer:
        with self._lock:
            if self._lltok is None:
                n_tok = min(self.n_vocab, self._tokenizer.hf.get_vocab_size(with_added_tokens=True))
                eos = sorted(self._tokenizer.eos_ids) or [n_tok - 1]  # a model without EOS: the tokenizer's last id
                self._lltok = llg.LLTokenizer(self._tokenizer.hf.to_str(), n_vocab=self.n_vocab, eos_token=eos)
            return self._lltok

    def compile(self, kind: str, source: str | dict | list, strict: bool = False) -> Constraint:
        """Raises RequestError naming the problem (kind, then the library's message)."""
        text = source if isinstance(source, str) else json.dumps(source)
        return self._compile(kind, text, strict)

    @instance_cache(256)
    def _compile(self, kind: str, text: str, strict: bool) -> Constraint:
        name = {"json_schema": "json_schema", "gbnf": "grammar"}.get(kind, kind)
        try:  # ValueError includes text the library cannot take (lone surrogates)
            grammar = _grammar(kind, text, strict)
            failed, messages = llg.LLMatcher.validate_grammar_with_warnings(grammar, self.lltok)
        except (ValueError, TypeError) as exc:
            raise RequestError(f"{name}: {_short(exc)}", code=f"invalid_{name}") from exc
        if failed:
            raise RequestError(f"{name}: {_short(messages[0])}", code=f"invalid_{name}")
        return Constraint(kind, text, grammar)

    def matcher(self, constraint: Constraint) -> llg.LLMatcher:
        return llg.LLMatcher(self.lltok, constraint.grammar, log_level=0)


def _grammar(kind: str, text: str, strict: bool) -> str:
    if kind == "json_schema":
        schema = json.loads(text)
        if not isinstance(schema, dict):
            raise ValueError("a JSON schema must be an object")
        options = dict(JSON_OPTIONS, lenient=not strict)
        return llg.LLMatcher.grammar_from_json_schema(schema, defaults=options)
    if kind == "choice":
        choices = json.loads(text)
        if not isinstance(choices, list) or not choices or not all(isinstance(c, str) for c in choices):
            raise ValueError("a choice must be a non-empty list of strings")
        return llg.LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in choices))
    if kind == "gbnf":
        return llg.grammar_from("gbnf", text)
    if kind == "lark":
        return llg.LLMatcher.grammar_from_lark(text)
    if kind == "regex":
        return llg.LLMatcher.grammar_from_regex(text)
    raise ValueError(f"unknown constraint kind {kind!r} (one of {', '.join(KINDS)})")


def _short(message: Any) -> str:
    text = str(message).strip()
    return text if len(text) <= 500 else text[:497] + "..."


class BatchMasker:
    """Token masks for the constrained rows of one step.

    ``start`` hands the matchers to a worker thread (which hands them on to
    llguidance's own thread pool, without the GIL) and returns at once; ``apply``
    waits for the result and sets every token a row's grammar forbids to -inf. A
    matcher must not be advanced between the two calls."""

    def __init__(self, n_vocab: int, n_threads: int | None = None):
        self.n_words = (n_vocab + 31) // 32
        threads = n_threads or max(1, min(4, (os.cpu_count() or 2) - 1))
        self._executor = llg.LLExecutor(num_threads=threads)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar-mask")
        self._bits = torch.arange(32, dtype=torch.int32)  # [32]

    def start(self, matchers: list[llg.LLMatcher], drafts: list[list[int]] | None = None) -> Future:
        """Row by row, what ``apply`` masks: for matcher i, a row for its next token,
        then one after each of the tokens of ``drafts[i]`` (a speculative proposal the
        grammar admits; the matcher is left where it was)."""
        drafts = drafts or [[] for _ in matchers]
        triples, row = [], 0
        for m, draft in zip(matchers, drafts, strict=True):
            triples.append((m, row, list(draft)))
            row += 1 + len(draft)
        masks = torch.zeros(row, self.n_words, dtype=torch.int32)  # [R, V/32]
        return self._pool.submit(self._fill, triples, masks)

    def _fill(self, triples: list, masks: torch.Tensor) -> torch.Tensor:
        size, ptr = self.n_words * 4, masks.data_ptr()
        plain = [(m, row) for m, row, draft in triples if not draft]
        drafted = [t for t in triples if t[2]]  # llguidance takes no empty proposal here
        if plain:
            self._executor.unsafe_compute_mask_ptr(plain, ptr, size, masks.shape[0])
        if drafted:
            self._executor.unsafe_compute_mask_ptr_with_draft_token(drafted, ptr, size, masks.shape[0])
        return masks

    def apply(self, pending: Future, logits: torch.Tensor) -> None:
        """logits: [R, V] (rows in ``start``'s order), masked in place."""
        masks = pending.result()  # [R, V/32]
        allowed = ((masks[:, :, None] >> self._bits) & 1).bool().flatten(1)  # [R, 32 * V/32]
        vocab = logits.shape[1]
        logits.masked_fill_(~allowed[:, :vocab].to(logits.device), float("-inf"))
