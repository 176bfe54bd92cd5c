"""Property tests over every family's tool-call reader (hypothesis): any text built of
the family's own markers, JSON-ish pieces and anything else, cut into any chunks —
reading never raises, and the stream's content and calls are the whole text's."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server.pipeline.tool_calls import FAMILIES, ToolCallStream, marker_text, parse
from server.pipeline.tool_calls.families import BY_NAME

TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
    "s": {"type": "string"}, "n": {"type": "integer"}}}}}  # fmt: skip
PIECES = ['{"name": "f", "arguments": {"s": "x", "n": 1}}', '{"s": "x"}', "f", '"f"', "\n", " ", "{", "}", "[", "]",
          '"', ":", ",", "<", ">", "=", "1", "functions.f", "<|", "|>", "NaN", "...", "b'x'"]  # fmt: skip


def pieces(fmt: str) -> st.SearchStrategy[str]:
    syntax = BY_NAME[fmt]
    markers = sorted({m for pair in syntax.pairs for m in pair if m} | {marker_text(fmt)})
    return st.lists(st.one_of(st.sampled_from(markers + PIECES), st.text(max_size=6)), max_size=14).map("".join)


def read_streamed(fmt: str, text: str, cuts: list[int]) -> tuple[str, list]:
    stream, parts, at = ToolCallStream(fmt, [TOOL]), [], 0
    for cut in cuts:
        parts += stream.push(text[at : at + cut])
        at += cut
    parts += stream.push(text[at:]) + stream.flush()
    return "".join(p for p in parts if isinstance(p, str)), [p for p in parts if not isinstance(p, str)]


@pytest.mark.parametrize("fmt", [f.name for f in FAMILIES])
def test_any_text_in_any_chunks_reads_as_the_whole(fmt):
    # derandomized: the same 60 cases every run (600 a family found nothing more, 2026-12-07)
    @settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
    @given(text=pieces(fmt), cuts=st.lists(st.integers(1, 9), max_size=12))
    def check(text, cuts):
        content, calls = parse(fmt, text, [TOOL])
        got_content, got_calls = read_streamed(fmt, text, cuts)
        assert got_content == content
        assert [(c.name, c.arguments) for c in got_calls] == [(c.name, c.arguments) for c in calls]

    check()
