"""The GGUF header reader (engine/loading/gguf/header.py) against gguf-py's GGUFReader on
files gguf-py's writer makes: every metadata value type, arrays, an alignment of its
own, tensors of float and block types; and malformed files refused as ValueError."""

from __future__ import annotations

import struct

import gguf
import numpy as np
import pytest

from engine.loading.gguf.header import read_header

T = gguf.GGMLQuantizationType


def write(path, alignment: int | None = None, tokens: list[str] | None = None):
    w = gguf.GGUFWriter(str(path), "llama")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_float32("t.f32", 0.1)
    w.add_uint64("t.u64", 2**63 + 5)
    w.add_int64("t.i64", -(2**62))
    w.add_float64("t.f64", 1 / 3)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo ✓")
    w.add_array("t.ints", [1, -2, 3])
    w.add_array("t.floats", [0.5, -1.25])
    w.add_token_list(tokens or ["<s>", "a", "b", "ab", "\u0120x"])
    w.add_token_scores([0.0, -1.5, -2.5, -3.0, -4.0])
    w.add_token_types([3, 1, 1, 1, 1])
    rng = np.random.default_rng(0)
    w.add_tensor("f32.weight", rng.standard_normal((3, 8)).astype(np.float32))
    w.add_tensor("f16.weight", rng.standard_normal((2, 4, 8)).astype(np.float16))
    q8 = gguf.quants.quantize(rng.standard_normal((4, 64)).astype(np.float32), T.Q8_0)
    w.add_tensor("q8.weight", q8, raw_shape=q8.shape, raw_dtype=T.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def reference(path):
    reader = gguf.GGUFReader(str(path), "r")
    fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    tensors = {
        t.name: (t.tensor_type, tuple(reversed([int(x) for x in t.shape])), int(t.data_offset), int(t.n_bytes))
        for t in reader.tensors
    }
    return fields, tensors


@pytest.mark.parametrize("alignment", [None, 64])
def test_the_same_fields_and_tensors_as_gguf_py(tmp_path, alignment):
    path = write(tmp_path / "m.gguf", alignment)
    fields, tensors = reference(path)
    header = read_header(path)
    assert header.fields == fields
    for key in fields:  # the same Python types too (int stays int, bool stays bool)
        assert type(header.fields[key]) is type(fields[key]), key
    assert {name: tuple(entry)[:4] for name, entry in header.tensors.items()} == tensors
    assert {entry.shard for entry in header.tensors.values()} == {0}  # one file: every tensor in the first
    assert header.tensors["q8.weight"].offset % (alignment or 32) == 0


def test_a_string_that_is_not_utf8_reads_as_none(tmp_path):
    path = write(tmp_path / "m.gguf")
    data = path.read_bytes().replace("\u0120x".encode(), b"\xff\xfe\xfd", 1)
    path.write_bytes(data)
    assert read_header(path).fields["tokenizer.ggml.tokens"] is None


def _header(version=3, n_tensors=0, n_fields=0) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_fields)


def _string(s: bytes) -> bytes:
    return struct.pack("<Q", len(s)) + s


@pytest.mark.parametrize(
    "raw, message",
    [
        (b"GGUF" + b"\x00" * 12, "too short"),
        (b"GGML" + _header()[4:], "magic"),
        (_header(version=1), "version 1"),
        (_header(n_fields=1) + _string(b"k") + struct.pack("<I", 99), "value type 99"),
        (_header(n_fields=2) + (_string(b"k") + struct.pack("<IB", 0, 1)) * 2, "twice"),
        (_header(n_fields=1) + _string(b"k") + struct.pack("<I", 8) + struct.pack("<Q", 10**6), "ends early"),
        (_header(n_tensors=1) + _string(b"w") + struct.pack("<IQIQ", 1, 8, 0, 0), "past the end"),
        (_header(n_tensors=1) + _string(b"w") + struct.pack("<IQIQ", 1, 8, 1234, 0), "1234"),
        (_header(n_fields=1) + _string(b"general.alignment") + struct.pack("<II", 4, 48), "power of two"),
    ],
)
def test_a_malformed_file_is_a_value_error(tmp_path, raw, message):
    path = tmp_path / "bad.gguf"
    path.write_bytes(raw)
    with pytest.raises(ValueError, match=message):
        read_header(path)
