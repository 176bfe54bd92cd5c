"""Accuracy beside llama.cpp's own (issue 36, item 6): on the same GGUF files and the same
tokens, llama-perplexity's ``--kl-divergence`` (each quantized file against the F32 file,
both run by llama.cpp) beside slotserve's (each file against slotserve's run of the F32
file): the mean KL divergence and how often the top token is the same.

    python bench/kld_llamacpp.py --perplexity ~/.cache/slotserve-peer/llama-perplexity \\
        --base demo-f32.gguf demo-q4_k_m.gguf demo-q8_0.gguf [--isa avx2] [--json out.json]

The text is a few Python standard-library files (``--text`` names others); llama-perplexity
cuts its tokens into chunks of ``--ctx`` and scores the second half of each chunk (the
first token of a chunk replaced by BOS where the vocabulary adds one), and so does this
script, on the tokens llama-perplexity stored in its base file. Each chunk goes through
slotserve's model in one forward, as a prompt's prefill does. llama-perplexity keeps the
base run's log-probabilities as 16-bit integers, a rounding that its own figures carry and
these do not. ``--isa`` runs slotserve's kernels on a lesser unit (SLOTSERVE_ISA).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import numpy as np

TEXT_FILES = ["fractions.py", "textwrap.py", "json/decoder.py", "statistics.py"]


def stdlib_text(dst: Path) -> Path:
    lib = Path(sysconfig.get_paths()["stdlib"])
    dst.write_text("\n\n".join((lib / f).read_text() for f in TEXT_FILES))
    return dst


def llama_kld(binary: str, base: Path, model: Path, text: Path, ctx: int, threads: int, logits: Path) -> dict:
    """Run llama-perplexity; with ``model == base`` it writes ``logits`` (the base run)."""
    cmd = [binary, "-m", str(model), "-c", str(ctx), "-t", str(threads), "-b", str(ctx)]
    if model == base:
        cmd += ["-f", str(text), "--kl-divergence-base", str(logits)]
    else:
        cmd += ["--kl-divergence-base", str(logits), "--kl-divergence"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {done.stderr[-2000:]}")
    out = done.stdout + done.stderr
    if model == base:
        return {}
    kld = re.search(r"Mean\s+KLD:\s+([-\d.e+]+)", out)
    top = re.search(r"Same top p:\s+([\d.]+)", out)
    return {"kld": float(kld.group(1)), "top1": float(top.group(1)) / 100}


def stored_tokens(logits: Path) -> tuple[int, np.ndarray]:
    """(n_ctx, tokens [n_chunk, n_ctx]) of llama-perplexity's base file."""
    raw = logits.read_bytes()
    assert raw[:8] == b"_logits_", f"{logits}: not a llama-perplexity base file"
    n_ctx, _, n_chunk = np.frombuffer(raw, dtype=np.int32, count=3, offset=8)
    tokens = np.frombuffer(raw, dtype=np.int32, count=int(n_ctx) * int(n_chunk), offset=20)
    return int(n_ctx), tokens.reshape(int(n_chunk), int(n_ctx))


def ours_logprobs(model: Path, chunks: np.ndarray, threads: int):
    """slotserve's log-probabilities [n_chunk, n_ctx - 1 - n_ctx / 2, vocab] (float64) at the
    positions llama-perplexity scores."""
    import torch

    from engine import Engine
    from memory import MemoryBatch

    torch.set_num_threads(threads)
    n_ctx = chunks.shape[1]
    engine = Engine.from_pretrained(str(model), n_ctx=n_ctx, n_seq_max=1, max_batch_tokens=n_ctx)
    bos = engine.tokenizer.bos_id if engine.tokenizer.add_bos else None
    first = n_ctx // 2
    out = []
    with torch.inference_mode():
        for row in chunks:
            ids = torch.from_numpy(row.astype(np.int64))
            if bos is not None:
                ids[0] = bos
            pos = torch.arange(n_ctx)  # [n_ctx]
            view = engine.memory.prepare(MemoryBatch([0], [n_ctx], pos))
            logits = engine.model(ids, pos, view, torch.arange(first, n_ctx - 1))  # [scored, vocab]
            out.append(torch.log_softmax(logits.double(), -1))
            engine.memory.seq_rm(0, 0)
    return torch.stack(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", type=Path, help="quantized GGUF files of the base model")
    ap.add_argument("--base", type=Path, required=True, help="the F32 GGUF")
    ap.add_argument("--perplexity", required=True, help="llama-perplexity")
    ap.add_argument("--text", type=Path, help="evaluation text (default: standard-library files)")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--isa", help="slotserve's kernel unit (portable, avx2, avx512: SLOTSERVE_ISA)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.isa:
        os.environ["SLOTSERVE_ISA"] = args.isa  # read when the extension loads
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from engine.kernels import blocks

    with tempfile.TemporaryDirectory() as tmp:
        text = args.text or stdlib_text(Path(tmp) / "text.txt")
        logits = Path(tmp) / "base.kld"
        llama_kld(args.perplexity, args.base, args.base, text, args.ctx, args.threads, logits)
        n_ctx, chunks = stored_tokens(logits)
        base = ours_logprobs(args.base, chunks, args.threads)
        rows = []
        for f in args.files:
            llama = llama_kld(args.perplexity, args.base, f, text, args.ctx, args.threads, logits)
            got = ours_logprobs(f, chunks, args.threads)
            kld = (base.exp() * (base - got)).sum(-1).mean().item()
            top1 = (got.argmax(-1) == base.argmax(-1)).double().mean().item()
            rows.append({"file": f.name, "llama": llama, "ours": {"kld": kld, "top1": top1}})
    unit = blocks.compiled_isa() or "torch"
    print(f"{len(chunks)} chunks of {n_ctx} tokens ({chunks.size} tokens), slotserve's kernel unit: {unit}")
    print("| file | llama.cpp mean KLD | slotserve mean KLD | ratio (<= 1.1) | llama.cpp top-1 | slotserve top-1 |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        lk, ok = r["llama"]["kld"], r["ours"]["kld"]
        print(
            f"| {r['file']} | {lk:.6f} | {ok:.6f} | {ok / lk if lk else float('nan'):.2f} "
            f"| {r['llama']['top1']:.2%} | {r['ours']['top1']:.2%} |"
        )
    if args.json:
        args.json.write_text(json.dumps({"unit": unit, "tokens": int(chunks.size), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
