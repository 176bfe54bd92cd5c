"""The slot file format and the save directory, without a server."""

from __future__ import annotations

import os

import pytest
import torch

from memory import PagedKVCache, SeqState
from memory.files.slot_dir import TMP_PREFIX, BadFileName, FileMissing, SlotDirectory, check_name
from memory.files.slot_file import SlotFileError, decode, encode, fingerprint_mismatch
from memory.spec import FullAttentionSpec

FP = {"architecture": "LlamaForCausalLM", "config_sha256": "c" * 64, "weights_sha256": "w" * 64, "dtype": "float32"}


def make_state(n: int, layers: int = 2, seed: int = 0) -> SeqState:
    g = torch.Generator().manual_seed(seed)
    tensors = {f"{kv}.{i}": torch.randn(n, 2, 8, generator=g) for i in range(layers) for kv in "kv"}
    return SeqState(torch.arange(n), tensors, {"memory_kind": "kv", "layers": "0,1"})


def test_round_trip_keeps_every_tensor_and_token():
    state = make_state(37)
    tokens = list(range(100, 137))
    file = decode(encode(tokens, state, FP))
    assert file.tokens == tokens
    assert file.fingerprint == FP
    assert torch.equal(file.state.positions, state.positions)
    assert file.state.tensors.keys() == state.tensors.keys()
    for name, t in state.tensors.items():
        assert torch.equal(file.state.tensors[name], t)
    assert file.state.meta == state.meta


def test_restores_into_another_block_size():
    specs = {i: FullAttentionSpec(2, 8, torch.float32) for i in range(2)}
    src = PagedKVCache(specs, n_blocks=16, n_seq_max=2, block_size=16)
    dst = PagedKVCache(specs, n_blocks=64, n_seq_max=3, block_size=4)
    state = make_state(37)
    src.load_seq(1, state)
    file = decode(encode(list(range(37)), src.save_seq(1), FP))
    dst.load_seq(2, file.state)
    again = dst.save_seq(2)
    for name, t in state.tensors.items():
        assert torch.equal(again.tensors[name], t)
    dst.integrity_check()


def test_every_flipped_byte_region_is_caught():
    data = encode(list(range(20)), make_state(20), FP)
    header_len = int.from_bytes(data[:8], "little")
    for offset in (3, 8 + header_len // 2, 8 + header_len + 5, len(data) // 2, len(data) - 1):
        bad = bytearray(data)
        bad[offset] ^= 0x01
        with pytest.raises(SlotFileError):
            decode(bytes(bad))


@pytest.mark.parametrize("cut", [0, 7, 100, -1])
def test_truncated_file_is_rejected(cut):
    data = encode(list(range(20)), make_state(20), FP)
    with pytest.raises(SlotFileError):
        decode(data[:cut])


def test_fingerprint_mismatch_names_the_field():
    assert fingerprint_mismatch(FP, dict(FP)) is None
    reason = fingerprint_mismatch({**FP, "weights_sha256": "x" * 64}, FP)
    assert "weights_sha256" in reason and "architecture" not in reason


def test_other_safetensors_is_not_a_slot_file():
    from safetensors.torch import save

    with pytest.raises(SlotFileError, match="not a slotserve slot file"):
        decode(save({"x": torch.zeros(3)}))


@pytest.mark.parametrize(
    "name",
    ["", "a/b", "a\\b", "..", "../x", "a..b", ".hidden", "x\x00y", "tab\there", "\x7f", "é" * 64, "x" * 64, "\ud800"],
)
def test_bad_names_are_rejected(name):
    with pytest.raises(BadFileName):
        check_name(name)


def test_good_names_pass():
    for name in ("a", "session-42.bin", "é" * 63, "x" * 63, "a.b.c", "a."):
        assert check_name(name) == name


def test_symlink_out_of_the_directory_is_rejected(tmp_path):
    root, outside = tmp_path / "slots", tmp_path / "outside"
    outside.mkdir()
    directory = SlotDirectory(root)
    (outside / "secret").write_bytes(encode([1], make_state(1), FP))
    (root / "link").symlink_to(outside / "secret")
    (root / "inner").symlink_to(root / "target")
    with pytest.raises(BadFileName):
        directory.read("link")
    with pytest.raises(BadFileName):
        directory.write("link", b"x")
    assert directory.path("inner") == root.resolve() / "inner"  # a link that stays inside is fine


def test_atomic_write_replaces_and_leaves_no_temporary(tmp_path):
    directory = SlotDirectory(tmp_path)
    first, second = encode([1, 2], make_state(2), FP), encode([3], make_state(1), FP)
    directory.write("s", first)
    directory.write("s", second)
    assert directory.read("s") == second
    assert os.listdir(tmp_path) == ["s"]


def test_files_are_the_owners_alone_even_over_an_open_file(tmp_path):
    """A slot file holds the prompt's token ids: 0600, also where it replaces a file
    that others could read."""
    directory = SlotDirectory(tmp_path)
    (tmp_path / "s").write_bytes(b"old")
    (tmp_path / "s").chmod(0o644)
    directory.write("s", encode([1, 2], make_state(2), FP))
    assert (tmp_path / "s").stat().st_mode & 0o777 == 0o600


def test_failed_write_keeps_the_old_file(tmp_path, monkeypatch):
    directory = SlotDirectory(tmp_path)
    old = encode([1, 2], make_state(2), FP)
    directory.write("s", old)

    def broken_fsync(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError):
        directory.write("s", encode([3], make_state(1), FP))
    monkeypatch.undo()
    assert directory.read("s") == old
    assert os.listdir(tmp_path) == ["s"]


def test_listing_skips_temporaries_and_foreign_files(tmp_path):
    directory = SlotDirectory(tmp_path)
    directory.write("good", encode([5, 6, 7], make_state(3), FP))
    (tmp_path / f"{TMP_PREFIX}deadbeef.tmp").write_bytes(b"partial")
    (tmp_path / "notes.txt").write_text("not a slot")
    entries = directory.list()
    assert [(e.filename, e.n_tokens) for e in entries] == [("good", 3)]
    with pytest.raises(SlotFileError):
        directory.delete("notes.txt")
    with pytest.raises(FileMissing):
        directory.delete("absent")
    directory.delete("good")
    assert sorted(os.listdir(tmp_path)) == [f"{TMP_PREFIX}deadbeef.tmp", "notes.txt"]


@pytest.mark.parametrize(
    "scales, error",
    [("0.5,1.0", None), ("abc", "not numbers"), ("0.5", "not 2 finite"), ("0.5,nan", "not 2 finite"), ("", None)],
)
def test_a_files_lora_scales_must_be_one_number_per_adapter(tmp_path, scales, error):
    """A file whose lora_scales are not a number per adapter of the server's set is a
    bad file (400), found while reading, before any slot is touched."""
    from engine.errors import BadSlotFile
    from engine.slot_files import SlotFiles, lora_scales

    files = SlotFiles(tmp_path)
    model = {**FP, "lora": "/a.gguf;/b.gguf"}
    files.write("s", [1, 2], make_state(2), {**model, "lora_scales": scales} if scales else model)
    if error is None:
        file, _ = files.read("s", model, vocab_size=100, n_ctx=64)
        assert lora_scales(file, model) == ((0.5, 1.0) if scales else ())
    else:
        with pytest.raises(BadSlotFile, match=error):
            files.read("s", model, vocab_size=100, n_ctx=64)
