"""llama-server's code-completion limits, in the engine: ``n_indent`` (a line after the
first indented less ends the output, cut at its first other character) and
``t_max_predict_ms`` (once that long after the first token, the output ends at a token
that writes a newline), each against the plain greedy run of the same prompt."""

from __future__ import annotations

import itertools

import pytest

import engine.core.acceptance as acceptance
from engine import DEMO_MODEL, Engine, SamplingParams
from engine.core.sequence import FinishReason
from engine.text.indent_limit import IndentLimit

PROMPT = "def fibonacci(n):"
N = 60


def indent_cut(text: str, n: int) -> int | None:
    """Where ``n_indent`` cuts ``text``, read off its lines."""
    lines = text.split("\n")
    pos = len(lines[0]) + 1
    for k, line in enumerate(lines[1:], 1):
        pad = len(line) - len(line.lstrip(" \t"))
        if pad < n and (pad < len(line) or k < len(lines) - 1):  # a character after the pad, or a newline
            return pos + pad
        pos += len(line) + 1
    return None


def test_the_indent_limit_reads_lines_as_llama_server():
    cases = ["a\n    b\n  c", "x\n\n    y", "\n\t\tz\n\t\tw\n\tv", "first line only", "a\n      ", "a\n  b\n    c"]
    for text, n in itertools.product(cases, (0, 1, 2, 3, 4)):
        for size in (1, 2, 3):  # however the text comes in pieces
            limit, cut, at = IndentLimit(n), None, 0
            for i in range(0, len(text), size):
                piece = limit.push(text[i : i + size]) if n else None
                if piece is not None:
                    cut = at + piece
                    break
                at += len(text[i : i + size])
            assert cut == (indent_cut(text, n) if n else None), (text, n, size)


def run(**params):
    engine = Engine.from_pretrained(str(DEMO_MODEL), n_seq_max=1, n_ctx=512)
    ids = engine.tokenizer.encode(PROMPT, True)
    seq = engine.add_sequence(ids, SamplingParams(temperature=0.0, max_tokens=N, ignore_eos=True, **params), seq_id=0)
    while engine.has_work:
        engine.step()
    return engine, seq


def test_n_indent_cuts_the_output_at_the_first_line_indented_less():
    _, plain = run()
    pad = min(len(line) - len(line.lstrip(" ")) for line in plain.text.split("\n")[1:-1])
    assert pad > 0 and "\n" in plain.text  # the demo model indents its lines
    _, cut = run(n_indent=pad + 1)
    at = indent_cut(plain.text, pad + 1)
    assert cut.text == plain.text[:at] and cut.finish_reason == FinishReason.LENGTH
    assert plain.text.startswith(cut.text) and len(cut.output_ids) < N
    _, enough = run(n_indent=pad)  # every line has that much: nothing is cut
    assert enough.text == plain.text


def test_t_max_predict_ms_ends_at_the_first_newline_past_the_limit(monkeypatch):
    engine, plain = run()
    ticks = itertools.count()
    monkeypatch.setattr(acceptance, "clock", lambda: float(next(ticks)))  # one second a token
    _, timed = run(t_max_predict_ms=1500)  # past the limit from the third token on
    newline = [b"\n" in engine.tokenizer.token_bytes(t) for t in plain.output_ids]
    end = next(i for i in range(2, N) if newline[i])
    assert timed.output_ids == plain.output_ids[: end + 1] and timed.finish_reason == FinishReason.LENGTH


@pytest.mark.parametrize("value", [0, -1])
def test_no_time_limit_changes_nothing(value):
    _, plain = run()
    _, same = run(t_max_predict_ms=value)
    assert same.output_ids == plain.output_ids
