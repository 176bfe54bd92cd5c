"""The issue-53 bench models: random weights at mixture-of-experts shapes that fit 2 cores,
as Hugging Face folders and as the GGUF files llama.cpp's pinned converter writes from
them (Q8_0), plus, where llama-quantize is at hand, its Q4_K_M preset for both and
gpt-oss's MXFP4 experts (its MXFP4_MOE preset: experts MXFP4, the rest Q8_0) — for
bench/moe_peer.sh (both servers load the same file).

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
import subprocess
import sys
from pathlib import Path

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
    from random_folder import write_random_folder

    folder, q8 = out / name, out / f"{name}-q8_0.gguf"
    if not (folder / "config.json").exists():
        classes = (getattr(transformers, c) for c in CLASSES[name])
        vector = lambda n: None if n.endswith("sinks") else 1.0 if "norm" in n else 0.0  # noqa: E731
        write_random_folder(folder, *classes, SHAPES[name], vector)
    if not q8.exists():
        convert(folder, q8, outtype="q8_0")
    made = [q8]
    quantize = Path(os.environ.get("SLOTSERVE_PEER_CACHE", Path.home() / ".cache/slotserve-peer")) / "llama-quantize"
    presets = {"q4_k_m": "Q4_K_M"} | ({"mxfp4": "MXFP4_MOE"} if name == "gpt_oss" else {})
    if quantize.exists():  # llama-quantize's presets, from the F16 file
        todo = {kind: preset for kind, preset in presets.items() if not (out / f"{name}-{kind}.gguf").exists()}
        if todo:
            f16 = convert(folder, out / f"{name}-f16.gguf", outtype="f16")
            for kind, preset in todo.items():
                cmd = [str(quantize), str(f16), str(out / f"{name}-{kind}.gguf"), preset]
                subprocess.run(cmd, check=True, capture_output=True)
            f16.unlink()
        made += [out / f"{name}-{kind}.gguf" for kind in presets]
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
