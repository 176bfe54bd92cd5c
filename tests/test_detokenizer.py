"""Incremental detokenization and stop strings across token boundaries."""

from __future__ import annotations

from checkpoints import write_byte_tokenizer

from engine.text.detokenizer import IncrementalDetokenizer, StopMatcher
from engine.text.tokenizer import Tokenizer


def test_never_emits_half_a_character(tmp_path):
    write_byte_tokenizer(tmp_path)
    tok = Tokenizer.from_folder(tmp_path)
    text = "a€b😀c"
    ids = tok.encode(text)
    assert len(ids) == len(text.encode())  # one token per byte
    detok = IncrementalDetokenizer(tok, tok.encode("x"))
    pieces = [detok.push(i) for i in ids]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) + detok.flush() == text
    assert pieces[1:4] == ["", "", "€"]


def test_stop_string_split_across_tokens():
    stop = StopMatcher(["</end>", "STOP"])
    out = [stop.push(x) for x in ["hello </", "en", "d> more"]]
    assert "".join(r.text for r in out) == "hello "
    assert out[-1].stop == "</end>"
    assert out[0].text == "hello " and out[1].text == ""


def test_partial_stop_prefix_is_released_when_it_diverges():
    stop = StopMatcher(["STOP"])
    assert stop.push("ab ST").text == "ab "
    result = stop.push("ART")
    assert result.text == "START" and result.stop is None
    assert stop.push("xSTO").text == "x"
    assert stop.flush() == "STO"


def test_a_tool_familys_special_markers_stay_in_the_text(tmp_path):
    """Kimi K2 writes its calls between special tokens, which the answer's text drops;
    the family's markers (tool_calls.preserved) are kept, so the call can be read, while
    other specials still vanish (llama.cpp's preserved tokens)."""
    from server.pipeline.preserved import preserved
    from server.pipeline.tool_calls import parse

    markers = ("<|tool_calls_section_begin|>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>")
    markers += ("<|tool_call_end|>", "<|tool_calls_section_end|>", "<|im_end|>")
    write_byte_tokenizer(tmp_path, specials=markers)
    tok = Tokenizer.from_folder(tmp_path)
    call = '<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{"a": 1}<|tool_call_end|>'
    answer = f"Sure.<|tool_calls_section_begin|>{call}<|tool_calls_section_end|><|im_end|>"
    ids = tok.encode(answer, add_special=False)
    keep = preserved(tok, "kimi-k2")  # no thought markers: Kimi K2 writes <think>, no special token here
    assert keep == {tok.special_id(m) for m in markers[:5]}

    def text(keep):
        detok = IncrementalDetokenizer(tok, tok.encode("x"), keep=keep)
        return "".join(detok.push(i) for i in ids) + detok.flush()

    assert text(frozenset()) == 'Sure.functions.f:0{"a": 1}'  # what the answer was before
    kept = text(keep)
    assert kept == answer.removesuffix("<|im_end|>")
    content, (found,) = parse("kimi-k2", kept)
    assert (content, found.name, found.arguments) == ("Sure.", "f", '{"a": 1}')
