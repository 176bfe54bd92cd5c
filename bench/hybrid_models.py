"""The issue-52 bench models: random weights at Qwen3.5-like shapes, as Hugging Face
folders and as the GGUF files llama.cpp's pinned converter writes from them (Q8_0), for
bench/hybrid_peer.sh (both servers load the same file).

    python bench/hybrid_models.py OUT_DIR            # both
    python bench/hybrid_models.py OUT_DIR --only dense

- dense: Qwen3.5 text, 24 layers (18 Gated DeltaNet, 6 gated attention: one in four),
  hidden 1536, FFN 4096, 16 key / 32 value heads of 128 in DeltaNet, 8 query / 2 KV
  heads of 256 in attention, vocabulary 151,936 tied: ~1.2B parameters.
- moe: Qwen3.5-MoE text, 24 layers, hidden 1024, 16 experts of 512 (top 4) and a shared
  expert of 512, 8 key / 16 value heads: ~1.0B parameters, ~0.35B active a token.

The tokenizer is the demo model's (byte-level BPE with merges, which llama-server
requires; the rest of the vocabulary is padding the converter names).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

COMMON = dict(
    num_hidden_layers=24,
    full_attention_interval=4,
    vocab_size=151936,
    head_dim=256,
    num_attention_heads=8,
    num_key_value_heads=2,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_conv_kernel_dim=4,
    tie_word_embeddings=True,
    max_position_embeddings=32768,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)
SHAPES = {
    "dense": ("qwen3_5", dict(COMMON, hidden_size=1536, intermediate_size=4096, linear_num_key_heads=16,
                              linear_num_value_heads=32)),
    "moe": ("qwen3_5_moe", dict(COMMON, hidden_size=1024, intermediate_size=2048, linear_num_key_heads=8,
                                linear_num_value_heads=16, num_experts=16, num_experts_per_tok=4,
                                moe_intermediate_size=512, shared_expert_intermediate_size=512)),
}  # fmt: skip


def build(name: str, out: Path) -> Path:
    """The folder and its Q8_0 GGUF under ``out`` (kept when already there) -> the GGUF."""
    import transformers
    from gguf_tools import convert
    from random_folder import write_random_folder

    arch, shape = SHAPES[name]
    folder, gguf = out / name, out / f"{name}-q8_0.gguf"
    if gguf.exists():
        return gguf
    if not (folder / "config.json").exists():
        classes = {
            "qwen3_5": (transformers.Qwen3_5TextConfig, transformers.Qwen3_5ForCausalLM),
            "qwen3_5_moe": (transformers.Qwen3_5MoeTextConfig, transformers.Qwen3_5MoeForCausalLM),
        }[arch]
        write_random_folder(folder, *classes, shape, lambda n: 0.0 if n.endswith(("norm.weight", "A_log")) else 1.0)
    convert(folder, gguf, outtype="q8_0", flags=("--no-mtp",))
    return gguf


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--only", choices=list(SHAPES))
    args = ap.parse_args()
    for name in [args.only] if args.only else SHAPES:
        print(build(name, args.out))


if __name__ == "__main__":
    main()
