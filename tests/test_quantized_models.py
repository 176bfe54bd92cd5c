"""Models whose weights stay in GGUF blocks agree with the float32 model on the same
values: a GGUF file per kept type (the demo model's weights packed by the test,
tests/block_packers.py) and a Hugging Face folder quantized at load (``--quantization``).
Teacher-forced over 512 positions, in chunks of 31 tokens, against the float32 model on the
decoded weights: the mean KL divergence is within 1.1x, and the top-1 agreement within 0.5
points, of llama.cpp's own arithmetic on the same weights (its activation rounding per
weight type and its f16 attention cache, emulated here on the float model): the accuracy
its users accept.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf_tools import requantize, write_gguf
from safetensors.torch import save_file
from test_packed_blocks import llama_rounded as int8_rounded

from engine import DEMO_MODEL, Engine
from engine.kernels import blocks
from engine.kernels.blocks import KEPT, PACKED, BlockEmbedding, BlockLinear
from engine.loading.gguf.checkpoint import GGUFCheckpoint
from memory import MemoryBatch

CHUNK = 31  # rows per forward: below blocks.COMPILED_MAX_ROWS
# The weights' arithmetic alone: float32 attention caches (weights in blocks default to f16
# ones, as llama.cpp's; tests/test_kv_types.py bounds what that rounding moves, and
# bench/kld_llamacpp.py compares both defaults with llama-perplexity's)
F32_CACHE = {"cache_type_k": "f32", "cache_type_v": "f32"}
N_POSITIONS = 512
T = gguf.GGMLQuantizationType


@pytest.fixture(scope="module")
def text_ids() -> list[int]:
    """512 positions of Python source (the demo model's kind of text), frozen in tests/data:
    it once read engine/core/engine.py itself, so editing that file's imports changed the
    test's text and moved its top-1 figures by 3 positions in 512 (read as numerics that
    hung on import order; they never did)."""
    engine = Engine.from_pretrained(str(DEMO_MODEL), n_ctx=64, n_seq_max=1)
    text = (Path(__file__).parent / "data" / "quantized_text.py.txt").read_text()
    ids = engine.tokenizer.encode(text)[: N_POSITIONS + 1]
    assert len(ids) == N_POSITIONS + 1
    return ids


def teacher_forced(engine: Engine, ids: list[int]) -> torch.Tensor:
    """The log-probabilities after each prefix of ``ids`` [len - 1, vocab], CHUNK tokens per forward."""
    out = []
    with torch.inference_mode():
        for start in range(0, len(ids) - 1, CHUNK):
            chunk = ids[start : min(start + CHUNK, len(ids) - 1)]
            pos = torch.arange(start, start + len(chunk))  # [n]
            view = engine.memory.prepare(MemoryBatch([0], [len(chunk)], pos))
            logits = engine.model(torch.tensor(chunk), pos, view, torch.arange(len(chunk)))  # [n, vocab]
            out.append(torch.log_softmax(logits.double(), -1))
    engine.memory.seq_rm(0, 0)
    return torch.cat(out)


def teacher_forced_top1(engine: Engine, ids: list[int]) -> torch.Tensor:
    return teacher_forced(engine, ids).argmax(-1)


def _agreement(ours: Engine, reference: Engine, ids: list[int]) -> float:
    return (teacher_forced_top1(ours, ids) == teacher_forced_top1(reference, ids)).double().mean().item()


# llama.cpp's activation rounding per weight type (its vec_dot_type): int8 blocks of 32 for
# the legacy types, of 256 for the K-quants and IQ4_XS, float16 / bfloat16 for those types
ACT_BLOCK = {T.Q4_0: 32, T.Q4_1: 32, T.Q5_0: 32, T.Q5_1: 32, T.Q8_0: 32, T.IQ4_NL: 32, T.MXFP4: 32}
ACT_BLOCK |= {T.Q2_K: 256, T.Q3_K: 256, T.Q4_K: 256, T.Q5_K: 256, T.Q6_K: 256, T.IQ4_XS: 256}


def llama_rounded(x: torch.Tensor, qtype: gguf.GGMLQuantizationType) -> torch.Tensor:
    """``x`` [..., K] as llama.cpp rounds a matmul's activations for weights of ``qtype``."""
    if qtype in (T.F16, T.BF16):
        return x.to(torch.float16 if qtype == T.F16 else torch.bfloat16).to(x.dtype)
    rows = x.reshape(-1, x.shape[-1])  # [rows, K]
    return int8_rounded(rows, ACT_BLOCK[qtype]).reshape(x.shape).to(x.dtype)


def as_llama_cpp_rounds(reference: Engine, ours: Engine) -> Engine:
    """A second engine on ``reference``'s float weights, with each projection's input
    rounded as llama.cpp rounds it for the type ``ours`` keeps that weight in, and its
    attention cache storing what ``ours``' stores (llama.cpp's default is f16, as ours
    for weights in blocks): llama.cpp's own arithmetic on these weights, the accuracy its
    users accept."""
    spec = next(s for s in ours.layer_specs if hasattr(s, "cache_k"))
    config = dataclasses.replace(reference.config, cache_type_k=spec.k_codec.name, cache_type_v=spec.v_codec.name)
    reference = Engine(config)
    for name, module in reference.model.named_modules():
        kept = ours.model.get_submodule(name) if isinstance(module, torch.nn.Linear) else None
        if isinstance(kept, BlockLinear):
            qtype = kept.parts[0].qtype
            module.register_forward_pre_hook(lambda _, args, qtype=qtype: (llama_rounded(args[0], qtype),))
    return reference


def assert_within_llama_cpp(ours: Engine, reference: Engine, ids: list[int], what: str) -> None:
    """Against the float32 model: ``ours``' mean KL divergence within 1.1x of llama.cpp's
    rounding on the same weights, and its top-1 agreement no more than 0.5 points lower."""
    base = teacher_forced(reference, ids)
    got = teacher_forced(ours, ids)
    llama = teacher_forced(as_llama_cpp_rounds(reference, ours), ids)

    def kld(p: torch.Tensor) -> float:
        return (base.exp() * (base - p)).sum(-1).mean().item()

    def top1(p: torch.Tensor) -> float:
        return (p.argmax(-1) == base.argmax(-1)).double().mean().item()

    figures = f"{what}: KLD {kld(got):.2e} (llama.cpp's rounding {kld(llama):.2e}), "
    figures += f"top-1 {top1(got):.1%} ({top1(llama):.1%}) of {len(ids) - 1} positions"
    assert kld(got) <= 1.1 * kld(llama) + 1e-7, figures
    assert top1(got) >= top1(llama) - 0.005, figures


def dequantized_folder(path: Path, dst: Path) -> Path:
    """A Hugging Face folder with the float32 values ``path``'s blocks stand for."""
    names = Engine.from_pretrained(str(path), n_ctx=64, n_seq_max=1, linear="torch").model.checkpoint_names()
    tensors = {name: t.float().contiguous() for _, name, t in GGUFCheckpoint(path).iter_hf_tensors(names)}
    dst.mkdir()
    save_file(tensors, str(dst / "model.safetensors"))
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(DEMO_MODEL / name, dst / name)
    return dst


@pytest.mark.parametrize("qtype", sorted(KEPT, key=int), ids=lambda t: t.name)
def test_a_gguf_of_each_type_keeps_its_blocks_and_agrees_with_its_float_model(demo_f32_gguf, text_ids, tmp_path, qtype):
    path = requantize(demo_f32_gguf, tmp_path / f"demo-{qtype.name}.gguf", qtype)
    ours = Engine.from_pretrained(str(path), n_ctx=1024, n_seq_max=1, **F32_CACHE)
    kept = [m for m in ours.model.modules() if isinstance(m, BlockLinear | BlockEmbedding)]
    assert not any(isinstance(m, torch.nn.Linear | torch.nn.Embedding) for m in ours.model.modules())
    assert ours.model.lm_head.parts[0] is ours.model.model.embed_tokens.table  # tied: one table
    file_bytes = GGUFCheckpoint(path).n_bytes
    weight_bytes = sum(m.weight_bytes for m in kept if m is not ours.model.lm_head)
    assert weight_bytes <= 1.1 * file_bytes  # the file's blocks (or the same values repacked), not a float copy
    linears = [m for m in kept if isinstance(m, BlockLinear) and m is not ours.model.lm_head]
    if qtype in PACKED and blocks.compiled_isa() is not None:  # repacked at load, every projection
        assert all(m.packed for m in linears)
    folder = dequantized_folder(path, tmp_path / "float")
    reference = Engine.from_pretrained(str(folder), n_ctx=1024, n_seq_max=1, linear="torch")
    assert_within_llama_cpp(ours, reference, text_ids, qtype.name)


@pytest.mark.parametrize("scheme", ["q8_0", "q4_0", "q4_k"])
def test_a_folder_quantized_at_load_agrees_with_its_float_model(text_ids, scheme):
    from engine.kernels.quantize import SCHEMES, quantize

    ours = Engine.from_pretrained(str(DEMO_MODEL), n_ctx=1024, n_seq_max=1, quantization=scheme, **F32_CACHE)
    assert ours.fingerprint["quantization"] == scheme
    layers = [m for m in ours.model.modules() if isinstance(m, BlockLinear)]
    assert layers and all(m.parts[0].qtype == SCHEMES[scheme] for m in layers)
    reference = Engine.from_pretrained(str(DEMO_MODEL), n_ctx=1024, n_seq_max=1, linear="torch")
    with torch.no_grad():
        for name, module in reference.model.named_modules():
            if isinstance(module, torch.nn.Linear) and isinstance(ours.model.get_submodule(name), BlockLinear):
                module.weight.copy_(quantize(module.weight, SCHEMES[scheme]).dequantize())
    assert_within_llama_cpp(ours, reference, text_ids, scheme)


def test_the_torch_only_path_agrees_everywhere(monkeypatch, text_ids):
    """No activation rounding off the compiled path: the same float arithmetic up to order."""
    monkeypatch.setattr(blocks, "_blocks", None)
    ours = Engine.from_pretrained(str(DEMO_MODEL), n_ctx=1024, n_seq_max=1, quantization="q8_0")
    assert {(s.k_codec.name, s.v_codec.name) for s in ours.layer_specs} == {("f16", "f16")}  # weights in blocks
    f16 = {"cache_type_k": "f16", "cache_type_v": "f16"}
    reference = Engine.from_pretrained(str(DEMO_MODEL), n_ctx=1024, n_seq_max=1, linear="torch", **f16)
    with torch.no_grad():
        for name, module in reference.model.named_modules():
            if isinstance(module, torch.nn.Linear) and not name.endswith("lm_head"):
                module.weight.copy_(ours.model.get_submodule(name).parts[0].dequantize())
    assert _agreement(ours, reference, text_ids[:129]) == 1.0


def test_quantization_needs_float32_and_a_known_scheme():
    with pytest.raises(ValueError, match="float32"):
        Engine.from_pretrained(str(DEMO_MODEL), quantization="q8_0", dtype="bfloat16")
    with pytest.raises(ValueError, match="q4_k"):
        Engine.from_pretrained(str(DEMO_MODEL), quantization="q4_x")


def test_a_server_started_with_quantization_serves(caplog):
    import httpx
    from server_proc import InProcessServer

    with (
        caplog.at_level(logging.INFO, logger="slotserve.kernels"),
        InProcessServer(metrics=True, quantization="q4_k") as srv,
    ):
        r = httpx.post(srv.url + "/completion", json={"prompt": "def add(a, b):", "n_predict": 8, "temperature": 0})
        assert r.status_code == 200 and r.json()["tokens_predicted"] == 8
        assert httpx.get(srv.url + "/props").json()["memory"]["integrity"] == "ok"
    assert [r.message for r in caplog.records if r.message.startswith("quantized matmuls:")]


def test_the_quantization_flag_is_checked():
    from pydantic import ValidationError

    from server.config.settings import ServerSettings

    with pytest.raises(ValidationError, match="quantization"):
        ServerSettings(quantization="q4_x")
    assert ServerSettings(quantization="q4_k").quantization == "q4_k"


def test_the_mmap_flags_are_llama_cpps():
    from server.cli import build_parser
    from server.config.flags import settings_from_args

    def parsed(*argv: str):
        return settings_from_args(build_parser().parse_args(["serve", *argv]))

    assert parsed().mmap is True
    assert parsed("--no-mmap").mmap is False
    assert parsed("--mmap").mmap is True


def _random_blocks(rng, qtype, rows: int, cols: int) -> np.ndarray:
    """Random blocks whose float16 scales are small and finite (Q4_K: d, dmin; Q6_K: d)."""
    values, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (rows, cols // values, size), dtype=np.uint8)
    for off in {T.Q4_K: (0, 2), T.Q6_K: (208,)}[qtype]:
        raw[:, :, off : off + 2] = np.full((rows, cols // values, 1), 0.001, np.float16).view(np.uint8)
    return raw.reshape(rows, -1)


def q4_k_m_like(src: Path, dst: Path, hidden: int, ffn: int, layers: int) -> Path:
    """A Llama of the given shape (the demo model's tokenizer) with random weights in
    Q4_K, the value and output matrices in Q6_K (as llama-quantize's Q4_K_M), norms F32."""
    rng = np.random.default_rng(0)
    vocab, kv = 4096, hidden // 4
    shapes = {"token_embd.weight": (vocab, hidden, T.Q4_K), "output.weight": (vocab, hidden, T.Q6_K)}
    for i in range(layers):
        for name, rows, cols, kind in [("attn_q", hidden, hidden, T.Q4_K), ("attn_k", kv, hidden, T.Q4_K),
                                       ("attn_v", kv, hidden, T.Q6_K), ("attn_output", hidden, hidden, T.Q4_K),
                                       ("ffn_gate", ffn, hidden, T.Q4_K), ("ffn_up", ffn, hidden, T.Q4_K),
                                       ("ffn_down", hidden, ffn, T.Q6_K)]:  # fmt: skip
            shapes[f"blk.{i}.{name}.weight"] = (rows, cols, kind)
    tensors = [(n, _random_blocks(rng, k, r, c), k) for n, (r, c, k) in shapes.items()]
    tensors += [("output_norm.weight", np.ones(hidden, np.float32), None)]
    for i in range(layers):
        tensors += [(f"blk.{i}.{n}.weight", np.ones(hidden, np.float32), None) for n in ("attn_norm", "ffn_norm")]
    dims = {"embedding_length": hidden, "feed_forward_length": ffn, "block_count": layers}
    dims |= {"attention.head_count": hidden // 64, "attention.head_count_kv": kv // 64, "rope.dimension_count": 64}
    return write_gguf(src, dst, tensors, {f"llama.{k}": v for k, v in dims.items()})


# Each measure follows glibc's malloc_trim: memory freed to the heap but not yet handed
# back to the system (the warm-up engine's, the load's read buffers) otherwise counts at
# one point and not at another, by chance (1.08x the file +- 0.1 between runs, measured).
RSS_PROBE = """
import ctypes, gc, sys
from engine import DEMO_MODEL, Engine, SamplingParams
def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))
def settled():
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
warm = Engine.from_pretrained(str(DEMO_MODEL), n_ctx=64, n_seq_max=1)  # torch's own start-up memory
warm.generate([[1, 2, 3]], SamplingParams(max_tokens=2))
del warm
settled()
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak (VmHWM) starts again from here
before = [status(k) for k in ("VmRSS", "RssAnon", "RssFile")]
engine = Engine.from_pretrained(sys.argv[1], n_ctx=64, n_seq_max=1, mmap=sys.argv[2] == "mmap",
                                repack=sys.argv[3] == "repack")
settled()
peak, after = status("VmHWM"), status("VmRSS")
engine.generate([[1, 2, 3]], SamplingParams(max_tokens=2))  # every weight read once
used = [status(k) for k in ("VmRSS", "RssAnon", "RssFile")]
print(before[0], peak, after, sum(engine.weight_bytes.values()), *(u - b for u, b in zip(used, before)))
"""


@pytest.mark.parametrize("mode, layout", [("read", "repack"), ("mmap", "repack"), ("mmap", "file")])
def test_a_q4_k_m_file_is_resident_at_its_own_size(demo_f32_gguf, tmp_path, mode, layout):
    """Resident weights <= 1.1x the file's tensor bytes; the load's peak <= 1.2x what
    stays resident after it (read tensor by tensor, never a float copy). Mapped and kept
    in the file's layout (--no-repack), the weights are the file's pages: once used,
    resident as file pages, not as memory of the process's own. Repacked from a mapping,
    each tensor's file pages are handed back once its packed copy is made."""
    import subprocess
    import sys

    path = q4_k_m_like(demo_f32_gguf, tmp_path / "big-q4_k_m.gguf", hidden=1024, ffn=2816, layers=8)
    file_bytes = GGUFCheckpoint(path).n_bytes
    assert file_bytes > 50e6  # big enough for the measure to mean something
    root = Path(__file__).resolve().parents[1]
    probe = [sys.executable, "-c", RSS_PROBE, str(path), mode, layout]
    done = subprocess.run(probe, capture_output=True, text=True, cwd=root)
    assert done.returncode == 0, done.stderr[-2000:]
    before, peak, after, weights, used, used_anon, used_file = map(int, done.stdout.split()[-7:])
    figures = f"file {file_bytes}, weights {weights}, rss +{after - before}, peak +{peak - before}, "
    figures += f"after use +{used} (anonymous +{used_anon}, file +{used_file})"
    assert weights <= 1.1 * file_bytes, figures
    assert after - before <= 1.1 * file_bytes, figures
    # after a step, its buffers and the cache come on top of the weights: 1.097-1.101x the
    # file measured (2026-11-29, read-repack, as before this session's changes), so 1.1x
    # failed by chance; a float copy of the weights would be 7x
    assert used <= 1.15 * file_bytes, figures
    assert peak - before <= 1.2 * (after - before), figures  # (the engine's warm-up step ran)
    if mode == "read" or (layout == "repack" and blocks.compiled_isa() is not None):
        assert used_file < 0.1 * file_bytes, figures
    else:
        assert used_file >= 0.8 * file_bytes, figures  # the weights are the file's pages
        assert used_anon <= 0.3 * file_bytes, figures  # (llama's q/k rows, permuted, are copies)


def test_a_server_reports_its_weights_by_type(demo_f32_gguf, tmp_path):
    import httpx
    from server_proc import InProcessServer, metric

    path = requantize(demo_f32_gguf, tmp_path / "demo-q4_k.gguf", T.Q4_K)  # Q8_0 where rows of 704 do not fit
    with InProcessServer(metrics=True, model=path) as srv:
        r = httpx.post(srv.url + "/completion", json={"prompt": "def add(a, b):", "n_predict": 8, "temperature": 0})
        assert r.status_code == 200 and r.json()["tokens_predicted"] == 8
        weights = httpx.get(srv.url + "/props").json()["weights"]
        in_file: dict[str, int] = {}
        for qtype, _, _, n, _ in GGUFCheckpoint(path).tensors.values():
            in_file[qtype.name] = in_file.get(qtype.name, 0) + n
        assert set(weights["types"]) == set(in_file) == {"Q4_K", "Q8_0", "F32"}
        for name in ("Q4_K", "Q8_0"):  # the file's bytes, or the same values repacked (Q4_K: scales in bytes)
            assert in_file[name] <= weights["types"][name] <= 1.1 * in_file[name]
        assert weights["bytes"] == sum(weights["types"].values()) <= 1.1 * sum(in_file.values())
        for kind, n in weights["types"].items():
            assert metric(srv.url, "slotserve_model_weight_bytes", type=kind) == n
