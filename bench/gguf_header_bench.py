"""Reading a GGUF file's header: engine/loading/gguf/header.py beside gguf-py's
``GGUFReader`` (every field's ``contents()``, as the checkpoint took them before), on a
file with a vocabulary of ``--vocab`` tokens, as many merges, scores and types (Qwen2.5's
tokenizer has 151,643 tokens and 151,387 merges; Llama 3's 128,256 and 280,147). Tensor
data is a token table of a few rows: the header is what is timed. Prints a markdown row
(median of ``--repeat`` reads, ms, and the ratio).

    python bench/gguf_header_bench.py --vocab 4096,32000,151643
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import gguf
import numpy as np

from engine.loading.gguf.header import read_header


def write(path: Path, vocab: int) -> Path:
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"tok{i}\u0120x" for i in range(vocab)])
    w.add_token_scores([float(-i) for i in range(vocab)])
    w.add_token_types([1] * vocab)
    w.add_token_merges([f"t{i} o{i}" for i in range(vocab)])
    w.add_tensor("token_embd.weight", np.zeros((4, 64), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def gguf_py(path: Path) -> dict:
    reader = gguf.GGUFReader(str(path), "r")
    return {name: field.contents() for name, field in reader.fields.items()}


def median_ms(fn, path: Path, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn(path)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", default="4096,32000,151643")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print("| vocabulary | gguf-py GGUFReader | read_header | ratio |")
    print("|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for vocab in map(int, args.vocab.split(",")):
            path = write(Path(tmp) / f"v{vocab}.gguf", vocab)
            assert read_header(path).fields["tokenizer.ggml.merges"] == gguf_py(path)["tokenizer.ggml.merges"]
            old, new = median_ms(gguf_py, path, args.repeat), median_ms(read_header, path, args.repeat)
            print(f"| {vocab:,} | {old:.0f} ms | {new:.0f} ms | {old / new:.1f}x |")


if __name__ == "__main__":
    main()
