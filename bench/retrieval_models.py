"""The issue-54 bench models: random weights at published retrieval shapes, as Hugging
Face folders and as the GGUF files llama.cpp's pinned converter writes from them (F16
and Q8_0), for bench/retrieval_peer.py (both servers load the same file).

    python bench/retrieval_models.py OUT_DIR

- bert_base: a BERT-base embedder (bge-base / e5-base shape: 12 layers, hidden 768, 12
  heads, MLP 3072, vocabulary 30,522, 512 positions; ~110M parameters), mean pooling,
  saved by sentence-transformers.
- xlmr_rerank: an XLM-RoBERTa-base cross-encoder (bge-reranker-base shape: 12 layers,
  hidden 768, vocabulary 250,002, 514 positions, one label; ~278M parameters).
- gemma_embed: an EmbeddingGemma-300M (24 Gemma 3 layers attending both ways, hidden
  768, 3 heads of 256 over one k/v head, MLP 1152, a window of 512, every sixth layer
  global; Dense 768 -> 3072 -> 768), mean pooling, saved by sentence-transformers and
  converted with ``--sentence-transformers-dense-modules``. The converter cuts Gemma's
  embedding table to the tokenizer's 600 rows (the published file has 262,144: ~200M
  of its ~300M parameters, read one row per token), so the file holds the ~100M of the
  layers and Dense modules.

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
GEMMA = dict(hidden_size=768, num_hidden_layers=24, num_attention_heads=3, num_key_value_heads=1, head_dim=256,
             query_pre_attn_scalar=256, intermediate_size=1152, sliding_window=512,
             max_position_embeddings=2048)  # fmt: skip
TYPES = ("f16", "q8_0")


MODELS = ("bert_base", "xlmr_rerank", "gemma_embed")


def build(out: Path, names: tuple[str, ...] = MODELS) -> dict[str, Path]:
    """The folders and files of the models ``names`` (what exists is kept); name -> path."""
    from encoders import make_bert_embedder, make_cross_encoder, make_embedding_gemma
    from gguf_tools import convert_many

    out.mkdir(parents=True, exist_ok=True)
    made = {  # name -> (the file that says the folder is complete, how to make it)
        "bert_base": ("modules.json", lambda f: make_bert_embedder(f, "mean", vocab_size=30522,
                                                                   max_position_embeddings=512, **BASE)),
        "xlmr_rerank": ("config.json", lambda f: make_cross_encoder(f, "xlm-roberta", vocab_size=250002,
                                                                    max_position_embeddings=514, **BASE)),
        "gemma_embed": ("modules.json", lambda f: make_embedding_gemma(f, dense=(3072, 768), **GEMMA)),
    }  # fmt: skip
    folders = {name: out / name for name in names}
    for name, folder in folders.items():
        if not (folder / made[name][0]).is_file():
            made[name][1](folder)
    dense = {"gemma_embed": ("--sentence-transformers-dense-modules",)}
    jobs = [(folder, out / f"{n}-{t}.gguf", t, dense.get(n, ())) for n, folder in folders.items() for t in TYPES]
    missing = [job for job in jobs if not job[1].is_file()]
    if missing:
        convert_many(missing)
    return {**folders, **{job[1].stem: job[1] for job in jobs}}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    for name, path in build(parser.parse_args().out).items():
        print(name, path)
