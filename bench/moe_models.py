"""The issue-53 bench models: random weights at mixture-of-experts shapes that fit 2 cores,
as Hugging Face folders and as the GGUF files llama.cpp's pinned converter writes from
them (Q8_0), plus, where llama-quantize is at hand, gpt-oss's MXFP4 experts (its
MXFP4_MOE preset: experts MXFP4, the rest Q8_0) — for bench/moe_peer.sh (both servers
load the same file).

    python bench/moe_models.py OUT_DIR                   # both
    python bench/moe_models.py OUT_DIR --only gpt_oss

- gpt_oss: gpt-oss's layout scaled down: 16 layers alternating a 128-token sliding
  window and full attention with sinks, hidden 1024, 16 query / 4 KV heads of 64,
  32 experts of 512 (top 4) with biases, vocabulary 151,936 untied: ~1.2B parameters,
  ~0.3B active a token.
- qwen3_moe: Qwen3-30B-A3B's layout scaled down: 16 layers, hidden 1024, 16 query / 4
  KV heads of 128 with q/k norms, 64 experts of 384 (top 8), vocabulary 151,936 untied:
  ~1.5B parameters, ~0.4B active.

The tokenizer is the demo model's (byte-level BPE with merges, which llama-server
requires; the rest of the vocabulary is padding the converter names).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

COMMON = dict(
    num_hidden_layers=16,
    hidden_size=1024,
    vocab_size=151936,
    tie_word_embeddings=False,
    max_position_embeddings=32768,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)
SHAPES = {
    "gpt_oss": dict(COMMON, num_attention_heads=16, num_key_value_heads=4, head_dim=64, num_local_experts=32,
                    num_experts_per_tok=4, intermediate_size=512, sliding_window=128,
                    layer_types=["sliding_attention", "full_attention"] * 8),
    "qwen3_moe": dict(COMMON, num_attention_heads=16, num_key_value_heads=4, head_dim=128, num_experts=64,
                      num_experts_per_tok=8, moe_intermediate_size=384, intermediate_size=2048, norm_topk_prob=True),
}  # fmt: skip
CLASSES = {"gpt_oss": ("GptOssConfig", "GptOssForCausalLM"), "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM")}


def build(name: str, out: Path) -> list[Path]:
    """The folder and its GGUFs under ``out`` (kept when already there) -> the GGUFs."""
    import transformers
    from gguf_tools import convert

    from engine import DEMO_MODEL

    folder, q8 = out / name, out / f"{name}-q8_0.gguf"
    if not (folder / "config.json").exists():
        config_cls, model_cls = (getattr(transformers, c) for c in CLASSES[name])
        torch.manual_seed(0)
        with torch.device("meta"):
            model = model_cls(config_cls(**SHAPES[name]))
        model = model.to_empty(device="cpu")
        with torch.no_grad():  # random, scaled as an initializer would (no slow init pass)
            for n, p in model.named_parameters():
                p.normal_(0, 0.02) if p.dim() > 1 or n.endswith("sinks") else p.fill_(1.0 if "norm" in n else 0.0)
        folder.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(folder)
        print(f"{name}: {sum(p.numel() for p in model.parameters()) / 1e9:.2f}B parameters", file=sys.stderr)
        del model
        for file in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(DEMO_MODEL / file, folder / file)
    if not q8.exists():
        convert(folder, q8, outtype="q8_0")
    made = [q8]
    quantize = Path(os.environ.get("SLOTSERVE_PEER_CACHE", Path.home() / ".cache/slotserve-peer")) / "llama-quantize"
    mx = out / f"{name}-mxfp4.gguf"
    if name == "gpt_oss" and quantize.exists():
        if not mx.exists():
            f16 = convert(folder, out / f"{name}-f16.gguf", outtype="f16")
            subprocess.run([str(quantize), str(f16), str(mx), "MXFP4_MOE"], check=True, capture_output=True)
            f16.unlink()
        made.append(mx)
    return made


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--only", choices=list(SHAPES))
    args = ap.parse_args()
    for name in [args.only] if args.only else SHAPES:
        for path in build(name, args.out):
            print(path)


if __name__ == "__main__":
    main()
