"""The issue-54 bench models: random weights at published retrieval shapes, as Hugging
Face folders and as the GGUF files llama.cpp's pinned converter writes from them (F16
and Q8_0), for bench/retrieval_peer.py (both servers load the same file).

    python bench/retrieval_models.py OUT_DIR

- bert_base: a BERT-base embedder (bge-base / e5-base shape: 12 layers, hidden 768, 12
  heads, MLP 3072, vocabulary 30,522, 512 positions; ~110M parameters), mean pooling,
  saved by sentence-transformers.
- xlmr_rerank: an XLM-RoBERTa-base cross-encoder (bge-reranker-base shape: 12 layers,
  hidden 768, vocabulary 250,002, 514 positions, one label; ~278M parameters).

The tokenizers are the tests' small ones (tests/encoders.py); the rest of each
vocabulary is rows no input reaches (the converter names them as padding). Inputs are
built from words each of which is one token, so their lengths are known."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

BASE = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
TYPES = ("f16", "q8_0")


def build(out: Path) -> dict[str, Path]:
    """Every folder and file (what exists is kept); name -> path."""
    from encoders import make_bert_embedder, make_cross_encoder
    from gguf_tools import convert_many

    out.mkdir(parents=True, exist_ok=True)
    folders = {"bert_base": out / "bert_base", "xlmr_rerank": out / "xlmr_rerank"}
    if not (folders["bert_base"] / "modules.json").is_file():
        make_bert_embedder(folders["bert_base"], "mean", vocab_size=30522, max_position_embeddings=512, **BASE)
    if not (folders["xlmr_rerank"] / "config.json").is_file():
        make_cross_encoder(
            folders["xlmr_rerank"], "xlm-roberta", vocab_size=250002, max_position_embeddings=514, **BASE
        )
    jobs = [(folder, out / f"{name}-{t}.gguf", t) for name, folder in folders.items() for t in TYPES]
    missing = [job for job in jobs if not job[1].is_file()]
    if missing:
        convert_many(missing)
    return {**folders, **{job[1].stem: job[1] for job in jobs}}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    for name, path in build(parser.parse_args().out).items():
        print(name, path)
