"""GGUF checkpoints written by llama.cpp's own converter: greedy tokens equal to
transformers on the same weights (F32, and Q8_0 against transformers on the
dequantized weights), the tokenizer rebuilt from GGUF metadata equal to the HF one on
200 varied strings, clear errors for what cannot be served, and peak memory while
loading."""

from __future__ import annotations

import dataclasses
import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from checkpoints import make_checkpoint
from family_files import FAMILIES
from gguf_tools import convert_many, converter_tree, reader_of, requantize, write_gguf
from safetensors.torch import load_file, save_file
from unavailable import unavailable

from engine import DEMO_MODEL, Engine, SamplingParams
from engine.errors import CheckpointError
from engine.loading.gguf.checkpoint import GGUFCheckpoint
from engine.loading.gguf.shards import OpenShards

PROMPTS = ["def fibonacci(n):", "import os\n\n", "class Stack:\n    def push(self, item):"]
N_NEW = 24


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    try:
        converter_tree()
    except RuntimeError as exc:  # no registry to download llama.cpp's converter from
        unavailable(f"llama.cpp's converter, the GGUF tests' oracle, cannot be had: {exc}", "SLOTSERVE_SKIP_GGUF")
    return tmp_path_factory.mktemp("gguf")


@pytest.fixture(scope="module")
def converted(folder, family_files) -> dict[str, tuple[Path, Path]]:
    """name -> (HF folder, its GGUF): this module's own files, converted up front, and
    every family of tests/family_files.py (as users' files are shaped: config class,
    tokenizer, pre name) by its family name."""
    ckpts = {"llama-spm": make_checkpoint(folder / "tiny-llama-spm", "llama", tokenizer="spm", vocab_size=1000)}
    for arch in ("qwen2", "qwen3"):
        ckpts[f"{arch}-f16"] = make_checkpoint(folder / f"tiny-{arch}", arch)
    ckpts["rss"] = make_checkpoint(  # ~52 MB of float32: the peak-memory test's
        folder / "rss-model", hidden_size=512, intermediate_size=1536, num_hidden_layers=10, vocab_size=8192
    )
    jobs = [(ck, folder / f"{name}.gguf", "f16" if name.endswith("-f16") else "f32") for name, ck in ckpts.items()]
    jobs += [(DEMO_MODEL, folder / "demo-q8_0.gguf", "q8_0")]  # the f32 one: conftest's demo_f32_gguf
    # the converter's own split (the split.* keys gguf-split writes): qwen3-split-0000K-of-0000N.gguf
    jobs += [(ckpts["qwen3-f16"], folder / "qwen3-split.gguf", "f16", ("--split-max-tensors", "7"))]
    convert_many(jobs)
    return {name: (ck, folder / f"{name}.gguf") for name, ck in ckpts.items()} | family_files


@pytest.fixture(scope="module")
def f32(demo_f32_gguf) -> Path:
    return demo_f32_gguf


@pytest.fixture(scope="module")
def q8(folder, converted) -> Path:
    return folder / "demo-q8_0.gguf"


def transformers_greedy(model_dir: Path, prompts: list[list[int]]) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = []
    for ids in prompts:
        with torch.no_grad():
            seq = model.generate(
                torch.tensor([ids]), max_new_tokens=N_NEW, min_new_tokens=N_NEW, do_sample=False, pad_token_id=0
            )
        out.append(seq[0, len(ids) :].tolist())
    return out


def engine_greedy(path: Path) -> tuple[Engine, list[list[int]], list[list[int]]]:
    engine = Engine.from_pretrained(str(path), n_seq_max=len(PROMPTS))
    prompts = [engine.tokenizer.encode(p) for p in PROMPTS]
    params = SamplingParams(temperature=0.0, max_tokens=N_NEW, ignore_eos=True)
    return engine, prompts, [g.token_ids for g in engine.generate(prompts, params)]


def test_a_converted_f32_gguf_gives_transformers_greedy_tokens(f32):
    engine, prompts, ours = engine_greedy(f32)
    assert ours == transformers_greedy(DEMO_MODEL, prompts)
    assert engine.model_config.architecture == "LlamaForCausalLM"
    assert engine.tokenizer.chat_template is not None  # tokenizer.chat_template came along


def test_a_q8_0_gguf_matches_transformers_on_the_dequantized_weights(q8, tmp_path):
    engine, prompts, ours = engine_greedy(q8)
    dequantized = tmp_path / "dequantized"  # the same weights as an HF folder, for transformers
    dequantized.mkdir()
    names = Engine.from_pretrained(str(q8), linear="torch").model.checkpoint_names()  # before any repacking
    tensors = {name: t.float().contiguous() for _, name, t in GGUFCheckpoint(q8).iter_hf_tensors(names)}
    save_file(tensors, str(dequantized / "model.safetensors"))
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(DEMO_MODEL / name, dequantized / name)
    original = load_file(str(DEMO_MODEL / "model.safetensors"))["model.layers.0.mlp.down_proj.weight"]
    assert not torch.equal(tensors["model.layers.0.mlp.down_proj.weight"], original)  # Q8_0 really rounded
    assert ours == transformers_greedy(dequantized, prompts)


def _strings(n: int) -> list[str]:
    rng = random.Random(0)
    pieces = [
        "héllo", "wörld", "naïve café", "日本語のテキスト", "中文", "🙂", "🚀🦙", "Привет", "مرحبا", "ελληνικά",
        "def f(x):", "return x**2", "    ", "\t\t", "\n\n\n", "  \n ", "{'a': [1, 2]}", "3.14159", "1234567",
        "x += 1", "#!/usr/bin/env python", "'''doc'''", "it's", "I'VE", "<|im_start|>", "<|endoftext|>", "a\u200db",
    ]  # fmt: skip
    return [
        "".join(rng.choice(pieces) + rng.choice(["", " ", "\n"]) for _ in range(rng.randint(1, 8))) for _ in range(n)
    ]


def test_the_rebuilt_tokenizer_gives_the_hf_tokenizers_ids(f32):
    from transformers import AutoTokenizer

    ours = Engine.from_pretrained(str(f32), n_seq_max=1).tokenizer
    hf = AutoTokenizer.from_pretrained(DEMO_MODEL)
    texts = _strings(200)
    assert [ours.encode(t, add_special=False) for t in texts] == [hf.encode(t, add_special_tokens=False) for t in texts]
    assert all(ours.decode(ours.encode(t)) == t.replace("<|im_start|>", "").replace("<|endoftext|>", "") for t in texts)


def _write_gguf(path: Path, arch: str, qtype: gguf.GGMLQuantizationType) -> Path:
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    data = np.zeros((4, 32), dtype=np.float32)
    if qtype == gguf.GGMLQuantizationType.F32:
        w.add_tensor("token_embd.weight", data)
    else:
        raw = np.zeros((4, gguf.quants.quant_shape_to_byte_shape((32,), qtype)[0]), dtype=np.uint8)
        w.add_tensor("token_embd.weight", raw, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_what_cannot_be_served_is_a_clear_error(tmp_path):
    cases = [
        (_write_gguf(tmp_path / "bert.gguf", "bert", gguf.GGMLQuantizationType.F32), "architecture 'bert'"),
        (_write_gguf(tmp_path / "q8_1.gguf", "llama", gguf.GGMLQuantizationType.Q8_1), "type Q8_1"),
    ]
    (tmp_path / "junk.gguf").write_bytes(b"GGUF" + b"\x00" * 12)
    cases.append((tmp_path / "junk.gguf", "not a readable GGUF"))
    for path, named in cases:
        with pytest.raises(CheckpointError, match=named):
            Engine.from_pretrained(str(path))


RSS_PROBE = """
import gc, math, sys
from engine import DEMO_MODEL, Engine
from engine.loading.gguf.checkpoint import GGUFCheckpoint
def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))
warm = Engine.from_pretrained(str(DEMO_MODEL), n_ctx=64, n_seq_max=1, linear="torch")  # torch's own start-up memory
del warm
gc.collect()
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak (VmHWM) starts again from here
before = status("VmRSS")
engine = Engine.from_pretrained(sys.argv[1], n_ctx=64, n_seq_max=1, linear="torch")  # loading alone: no repacking
peak = status("VmHWM")
size = 4 * sum(math.prod(t[1]) for t in GGUFCheckpoint(engine.config.model).tensors.values())  # float32
print(before, peak, size)
"""


def test_peak_memory_while_loading_stays_under_one_and_a_half_times_the_model(converted):
    _, path = converted["rss"]
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", RSS_PROBE, str(path)], capture_output=True, text=True, cwd=root)
    assert done.returncode == 0, done.stderr[-2000:]
    before, peak, size = map(int, done.stdout.split()[-3:])
    assert size > 50e6  # big enough for the measure to mean something
    assert peak - before < 1.5 * size, json.dumps({"grew_by": peak - before, "model": size})


def _greedy(path: Path, prompts: list[list[int]], n: int = N_NEW, **config) -> list[list[int]]:
    engine = Engine.from_pretrained(str(path), n_seq_max=len(prompts), **config)
    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    return [g.token_ids for g in engine.generate(prompts, params)]


ARCH_PROMPTS = [[10, 20, 30, 40, 50, 60, 70, 80, 90], [7, 99, 3]]  # the first outgrows the sliding windows
# Steps compared where 16-bit activations (or a float16 cache) meet float ones: further on,
# a router's near-tie in these random expert models (a gap of 0.007 between the 2nd and
# 3rd expert of gpt-oss's, measured) picks other experts on either side of a rounding.
N_ROUNDED = 16


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])  # llama: the demo model's tests above
def test_a_float16_gguf_matches_transformers_on_the_rounded_weights(folder, converted, arch):
    ckpt, path = converted[f"{arch}-f16"]  # matrices in float16, as most GGUFs ship
    halved = folder / f"tiny-{arch}-f16"  # transformers on the same float16-rounded weights
    shutil.copytree(ckpt, halved, dirs_exist_ok=True)
    weights = load_file(str(ckpt / "model.safetensors"))
    save_file(
        {k: (v.half().float() if v.dim() == 2 else v) for k, v in weights.items()}, str(halved / "model.safetensors")
    )
    assert _greedy(path, ARCH_PROMPTS) == transformers_greedy(halved, ARCH_PROMPTS)


@pytest.mark.parametrize("arch", ["gemma3n", "granitemoehybrid", "jamba", "qwen3_next"])
def test_architectures_with_rebuilt_tensors_keep_the_rest_in_blocks(converted, folder, monkeypatch, arch):
    """Gemma 3n's stacked AltUp projections, Granite's split gate/up and Jamba's and
    Qwen3-Next's stacked experts are rebuilt in float at load (Qwen3-Next's fused b/a
    rows are taken from its blocks); every other matrix of a Q8_0 file stays in its
    blocks, and greedy tokens equal those of the same file fully dequantized (in the
    file's layout with 16-bit activations and a float32 cache, which keep these random
    models' near-ties; the defaults' 8-bit arithmetic and f16 cache are held to llama.cpp's
    in test_quantized_models and bench/kld_llamacpp.py)."""
    from engine.kernels import blocks
    from engine.kernels.blocks import BlockEmbedding, BlockLinear
    from engine.loading.gguf import archs

    _, f32 = converted[arch]
    q8 = gguf.GGMLQuantizationType.Q8_0
    path = requantize(f32, folder / f"{arch}-q8_0.gguf", q8, fallback=q8)  # other rows stay F32
    kept = Engine.from_pretrained(str(path), n_seq_max=1).model
    n_kept = sum(isinstance(m, BlockLinear | BlockEmbedding) for m in kept.modules())
    assert n_kept >= 20, f"{n_kept} layers in blocks"
    monkeypatch.setattr(blocks, "ACTIVATIONS", "int16")
    ours = _greedy(path, ARCH_PROMPTS, N_ROUNDED, repack=False, cache_type_k="f32", cache_type_v="f32")
    key = GGUFCheckpoint(path).arch
    monkeypatch.setitem(archs.ARCHITECTURES, key, dataclasses.replace(archs.ARCHITECTURES[key], keeps_blocks=False))
    assert not any(isinstance(m, BlockLinear) for m in Engine.from_pretrained(str(path), n_seq_max=1).model.modules())
    assert ours == _greedy(path, ARCH_PROMPTS, N_ROUNDED)


@pytest.mark.parametrize(
    "arch", ["qwen3_5", "qwen3_5_moe", "lfm2_moe", "nemotron_h", "qwen3_moe", "glm4_moe", "phi3", "gpt_oss"]
)
def test_stacked_experts_and_tiled_heads_stay_in_blocks(converted, folder, monkeypatch, arch):
    """A Q8_0 file (experts quantized too, as llama-quantize writes them): each expert's
    matrices are its rows of the layer's stacked tensor, in blocks; Qwen3.5's value
    heads are read in the file's tiled order, so its DeltaNet projections stay in blocks
    too, and Phi-3's fused q/k/v and gate/up are their rows of the file's fused tensors.
    Greedy tokens equal those of the same file read in float (as above)."""
    from engine.kernels import blocks
    from engine.kernels.blocks import BlockLinear
    from engine.loading.gguf import archs

    _, f32 = converted[arch]
    q8 = gguf.GGMLQuantizationType.Q8_0
    path = requantize(f32, folder / f"{arch}-experts-q8_0.gguf", q8, fallback=q8, experts=True)
    kept = {
        p for p, m in Engine.from_pretrained(str(path), n_seq_max=1).model.named_modules() if isinstance(m, BlockLinear)
    }
    assert any(".experts.0." in p for p in kept) == (arch not in ("qwen3_5", "phi3"))
    assert arch != "phi3" or {"model.layers.0.self_attn.qkv_proj", "model.layers.0.mlp.gate_up_proj"} <= kept
    assert (
        arch not in ("qwen3_5", "qwen3_5_moe")
        or {"model.layers.0.linear_attn.out_proj", "model.layers.0.linear_attn.in_proj_qkv"} <= kept
    )
    monkeypatch.setattr(blocks, "ACTIVATIONS", "int16")
    ours = _greedy(path, ARCH_PROMPTS, N_ROUNDED, repack=False, cache_type_k="f32", cache_type_v="f32")
    key = GGUFCheckpoint(path).arch
    monkeypatch.setitem(archs.ARCHITECTURES, key, dataclasses.replace(archs.ARCHITECTURES[key], keeps_blocks=False))
    assert ours == _greedy(path, ARCH_PROMPTS, N_ROUNDED)


def test_mxfp4_experts_stay_in_blocks_and_answer_as_transformers_on_their_values(converted, folder, monkeypatch):
    """gpt-oss as its GGUFs ship: the experts in MXFP4 (an e8m0 scale and 32 e2m1 values
    a block), the rest as converted. The experts stay in their blocks; with float
    activations the tokens and logits are transformers' on the folder whose experts hold
    the MXFP4 values (the file's, dequantized by gguf-py), and the default 8-bit
    activations give the same tokens."""
    from safetensors.torch import load_file, save_file

    from engine.kernels import blocks
    from engine.kernels.blocks import BlockLinear

    ckpt, f32 = converted["gpt_oss"]
    mx = gguf.GGMLQuantizationType.MXFP4

    def tensors():
        for t in reader_of(f32).tensors:
            data = np.asarray(t.data)
            if t.name.endswith("_exps.weight"):
                rows = data.reshape(-1, data.shape[-1]).astype(np.float32)
                yield t.name, gguf.quants.quantize(rows, mx).reshape(*data.shape[:-1], -1), mx
            else:
                yield t.name, data, None

    path = write_gguf(f32, folder / "gpt_oss-mxfp4.gguf", list(tensors()))
    # the folder with the file's expert values (and YaRN as the file reads it)
    rounded = FAMILIES["gpt_oss"].as_file(ckpt, folder / "gpt_oss-mxfp4")
    weights = load_file(str(ckpt / "model.safetensors"))
    file = {t.name: t for t in reader_of(path).tensors}
    for i in range(json.loads((ckpt / "config.json").read_text())["num_hidden_layers"]):

        def values(kind: str, i: int = i) -> torch.Tensor:  # [E, out, in] as the file holds them, dequantized
            t = file[f"blk.{i}.ffn_{kind}_exps.weight"]
            return torch.from_numpy(gguf.quants.dequantize(np.asarray(t.data), mx)).float()

        gate, up = values("gate"), values("up")  # [E, F, H]
        gate_up = torch.empty(gate.shape[0], gate.shape[2], 2 * gate.shape[1])  # [E, H, 2F], x @ W
        gate_up[..., 0::2], gate_up[..., 1::2] = gate.transpose(1, 2), up.transpose(1, 2)
        weights[f"model.layers.{i}.mlp.experts.gate_up_proj"] = gate_up
        weights[f"model.layers.{i}.mlp.experts.down_proj"] = values("down").transpose(1, 2).contiguous()  # [E, F, H]
    save_file(weights, str(rounded / "model.safetensors"), metadata={"format": "pt"})

    kept = Engine.from_pretrained(str(path), n_seq_max=1).model.model.layers[1].mlp.experts[0]
    assert isinstance(kept.gate_up_proj, BlockLinear) and isinstance(kept.down_proj, BlockLinear)
    assert not torch.equal(weights["model.layers.1.mlp.experts.down_proj"], load_file(str(ckpt / "model.safetensors"))[
        "model.layers.1.mlp.experts.down_proj"])  # MXFP4 really rounded  # fmt: skip
    expect = transformers_greedy(rounded, ARCH_PROMPTS)
    f32_cache = dict(cache_type_k="f32", cache_type_v="f32")  # (the default's float16: see N_ROUNDED)
    assert _greedy(path, ARCH_PROMPTS, **f32_cache) == expect  # the default 8-bit activations
    monkeypatch.setattr(blocks, "ACTIVATIONS", "float")
    assert _greedy(path, ARCH_PROMPTS, **f32_cache) == expect


def _sentencepiece_ids(folder: Path, text: str, added: dict[str, int]) -> list[int]:
    """``text`` through the folder's tokenizer.model: the added tokens matched whole, each
    piece of text between them encoded by SentencePiece (its space in front of each)."""
    import re

    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(folder / "tokenizer.model"))
    pattern = "(" + "|".join(map(re.escape, sorted(added, key=len, reverse=True))) + ")"
    ids: list[int] = []
    for i, piece in enumerate(re.split(pattern, text)):
        ids += [added[piece]] if i % 2 else (sp.encode(piece) if piece else [])
    return ids


@pytest.mark.parametrize("name,kind,leading", [("llama-spm", "llama", b" "), ("gemma4", "gemma4", b"")])
def test_a_sentencepiece_style_gguf_tokenizer_gives_the_hf_tokenizers_ids(converted, name, kind, leading):
    """SentencePiece (scores, a space put in front of the text and of the text after each
    special token: llama.cpp's rule, transformers' ``legacy`` Llama tokenizer) and Gemma
    4's BPE (the file's merges over raw UTF-8 with byte fallback, no space in front)."""
    from transformers import AutoTokenizer

    ckpt, path = converted[name]
    assert GGUFCheckpoint(path).get("tokenizer.ggml.model") == kind
    ours = Engine.from_pretrained(str(path), n_seq_max=1).tokenizer
    hf = AutoTokenizer.from_pretrained(ckpt, **({"legacy": True} if kind == "llama" else {}))
    texts = _strings(200)
    want = [hf.encode(t, add_special_tokens=False) for t in texts]
    if kind == "llama":  # SentencePiece itself on each piece of text between special tokens, as llama.cpp runs it
        want = [_sentencepiece_ids(ckpt, t, hf.get_added_vocab()) for t in texts]
    assert [ours.encode(t, add_special=False) for t in texts] == want
    assert [ours.encode(t) for t in texts[:20]] == [hf.encode("")[:1] + ids for ids in want[:20]]  # the file's add_bos
    if kind == "llama":  # the text back as it was; after a special token with the space llama.cpp put in front
        plain = [t for t in texts if "<|" not in t]
        assert len(plain) > 20 and [ours.decode(ours.encode(t)) for t in plain] == plain
    else:
        assert [ours.decode(ours.encode(t)) for t in texts] == [
            hf.decode(hf.encode(t), skip_special_tokens=True) for t in texts
        ]
    pieces = [ours.token_bytes(i) for i in ours.encode("x hello", add_special=False)]
    assert b"".join(pieces) == leading + b"x hello"  # U+2581 is a space (what grammars match against)


def test_a_gpt_oss_file_reads_yarn_as_llama_cpp_does(converted, tmp_path):
    """The converter drops gpt-oss's ``truncate: false``; llama.cpp then floors and ceils
    YaRN's correction range (ggml_rope_yarn_corr_dims): the file's logits are
    transformers' with ``truncate: true`` on the same weights, not the folder's."""
    from transformers import AutoModelForCausalLM

    ckpt, path = converted["gpt_oss"]
    assert json.loads((ckpt / "config.json").read_text())["rope_parameters"]["truncate"] is False
    engine = Engine.from_pretrained(str(path), n_seq_max=1)
    prompt = ARCH_PROMPTS[0] * 3  # 27 positions
    engine.add_sequence(prompt, SamplingParams(temperature=0.0, max_tokens=1), seq_id=0)
    ours = next(ev.logits for ev in engine.step(keep_logits=True) if ev.logits is not None)
    as_file = tmp_path / "truncated"
    shutil.copytree(ckpt, as_file)
    cfg = json.loads((as_file / "config.json").read_text())
    cfg["rope_parameters"]["truncate"] = True  # the oracle reads YaRN as the file describes it
    (as_file / "config.json").write_text(json.dumps(cfg))
    want = {}
    for name, folder in (("file", as_file), ("folder", ckpt)):
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        with torch.no_grad():
            want[name] = model(torch.tensor([prompt])).logits[0, -1]
    assert (ours - want["file"]).abs().max() < 1e-4
    assert (ours - want["folder"]).abs().max() > 1e-3


def test_a_split_gguf_loads_from_any_shard_as_the_whole_file(converted, folder, tmp_path):
    """gguf-split's shards (NAME-0000K-of-0000N.gguf, split.* keys; here written by the
    pinned converter's --split-max-tensors) are one model, as llama-server reads them:
    the same tokens and logits as the unsplit file, from the first shard's name or any
    other's; a missing shard is a clear error."""
    shards = sorted(folder.glob("qwen3-split-*-of-*.gguf"))
    assert len(shards) >= 3 and all(reader_of(s).fields["split.count"].contents() == len(shards) for s in shards)

    def logits(engine: Engine, prompt: list[int]) -> torch.Tensor:
        engine.add_sequence(prompt, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True), seq_id=0)
        steps = []
        while engine.has_work:
            steps += [ev.logits for ev in engine.step(keep_logits=True) if ev.logits is not None]
        return torch.stack(steps)  # [4, V]

    whole, prompts, want = engine_greedy(converted["qwen3-f16"][1])
    for shard in (shards[0], shards[-1]):
        engine, _, got = engine_greedy(shard)
        assert got == want
        assert torch.equal(logits(engine, prompts[0]), logits(whole, prompts[0]))
    for shard in shards[:1] + shards[2:]:
        shutil.copy(shard, tmp_path / shard.name)
    with pytest.raises(CheckpointError, match=f"shard 2 of {len(shards)} is missing"):
        Engine.from_pretrained(str(tmp_path / shards[0].name))


def test_a_gguf_serves_over_http(f32):
    import httpx
    from server_proc import InProcessServer

    with InProcessServer(model=f32, parallel=1) as srv:
        assert httpx.get(srv.url + "/v1/models").json()["data"][0]["id"] == "demo-f32.gguf"
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        assert httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=60).status_code == 200


def _q4_k_blocks(rng: np.random.Generator, n_blocks: int) -> tuple[bytes, np.ndarray]:
    """Q4_K blocks packed by hand from random integers, and the values they stand for
    (llama.cpp's layout: d, dmin, 12 bytes of 6-bit scales and mins, 128 of nibbles)."""
    raw, values = b"", []
    for _ in range(n_blocks):
        d, dmin = np.float16(rng.uniform(0.01, 0.1)), np.float16(rng.uniform(0.01, 0.1))
        sc, mn = rng.integers(0, 64, 8), rng.integers(0, 64, 8)
        q = rng.integers(0, 16, (8, 32))  # 8 sub-blocks of 32
        scales = np.zeros(12, dtype=np.uint8)
        for j in range(4):
            scales[j] = (sc[j] & 63) | ((sc[j + 4] >> 4) << 6)
            scales[j + 4] = (mn[j] & 63) | ((mn[j + 4] >> 4) << 6)
            scales[j + 8] = (sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4)
        qs = np.concatenate([q[2 * i] | (q[2 * i + 1] << 4) for i in range(4)]).astype(np.uint8)
        raw += d.tobytes() + dmin.tobytes() + scales.tobytes() + qs.tobytes()
        values.append((float(d) * sc[:, None] * q - float(dmin) * mn[:, None]).reshape(-1))
    return raw, np.concatenate(values)


def _q6_k_blocks(rng: np.random.Generator, n_blocks: int) -> tuple[bytes, np.ndarray]:
    """Q6_K blocks: 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 int8 scales, d."""
    raw, values = b"", []
    for _ in range(n_blocks):
        d = np.float16(rng.uniform(0.01, 0.1))
        sc = rng.integers(-128, 128, 16)
        q = rng.integers(0, 64, 256)  # stored with +32
        ql, qh = np.zeros(128, dtype=np.uint8), np.zeros(64, dtype=np.uint8)
        for half in range(2):
            y = q[128 * half : 128 * half + 128]
            for i in range(32):
                ql[64 * half + i] = (y[i] & 15) | ((y[i + 64] & 15) << 4)
                ql[64 * half + i + 32] = (y[i + 32] & 15) | ((y[i + 96] & 15) << 4)
                qh[32 * half + i] = (
                    (y[i] >> 4) | ((y[i + 32] >> 4) << 2) | ((y[i + 64] >> 4) << 4) | ((y[i + 96] >> 4) << 6)
                )
        raw += ql.tobytes() + qh.tobytes() + sc.astype(np.int8).tobytes() + d.tobytes()
        values.append(float(d) * np.repeat(sc, 16) * (q - 32))
    return raw, np.concatenate(values)


def test_k_quants_dequantize_to_the_values_packed_by_hand(tmp_path):
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(tmp_path / "k.gguf"), "llama")
    expected = {}
    for name, qtype, pack, shape in [
        ("q4k.weight", gguf.GGMLQuantizationType.Q4_K, _q4_k_blocks, (3, 512)),
        ("q6k.weight", gguf.GGMLQuantizationType.Q6_K, _q6_k_blocks, (2, 768)),
    ]:
        raw, values = pack(rng, shape[0] * shape[1] // 256)
        data = np.frombuffer(raw, dtype=np.uint8).reshape(shape[0], -1)
        w.add_tensor(name, data, raw_dtype=qtype)
        expected[name] = values.reshape(shape)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    ck = GGUFCheckpoint(tmp_path / "k.gguf")
    files = OpenShards(ck.shards)
    try:
        for name, values in expected.items():
            got = ck.tensor(name, files)
            assert tuple(got.shape) == values.shape
            torch.testing.assert_close(got.double(), torch.from_numpy(values), rtol=1e-5, atol=1e-5)
    finally:
        files.close()


SPEC_ARCHS = ["qwen3-f16", "qwen3_5", "qwen3_5_moe", "qwen3_next", "gemma3", "gemma4", "lfm2", "lfm2_moe",
              "nemotron_h", "mamba2"]  # fmt: skip


@pytest.mark.parametrize("arch", SPEC_ARCHS)
def test_speculation_on_a_quantized_file_gives_plain_decodings_logits_bit_for_bit(converted, folder, arch):
    """The default 8-bit kernels round each projection's input to 8 bits, which turns a
    last-bit difference anywhere before into whole steps now and then, so a verify
    step's rows must compute exactly as the decode steps of their positions: the packed
    projections do whatever the row count; attention reads the rows through the decode
    kernel, recurrent mixers step them a token at a time (``MemoryBatch.stepwise``);
    activations and small float projections are row-invariant (engine/models/rowwise.py).
    Attention, hybrids (Gated DeltaNet, short convolutions, Mamba2 with attention and
    experts), sliding windows and shared KV; proposals kept whole, in part and not at all."""
    from test_speculation import PROMPTS, Oracle, run

    from engine.kernels import attention

    if not attention.install_decode_attention():
        pytest.skip("the compiled decode kernel is not built (no compiler): SDPA's rows are close, not equal")
    q8 = gguf.GGMLQuantizationType.Q8_0
    path = requantize(converted[arch][1], folder / f"{arch}-spec-q8_0.gguf", q8, fallback=q8)
    plain, plain_logits = run(path, PROMPTS, spec=False)
    fast, fast_logits = run(path, PROMPTS, spec=True, draft=Oracle({s.seq_id: s.output_ids for s in plain}, 2))
    assert [s.output_ids for s in fast] == [s.output_ids for s in plain]
    for i in plain_logits:
        assert all(torch.equal(x, y) for x, y in zip(plain_logits[i], fast_logits[i], strict=True))
    assert all(s.n_draft_accepted > 0 and s.n_drafted > s.n_draft_accepted for s in fast)
