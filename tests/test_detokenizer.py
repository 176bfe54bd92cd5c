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
