"""Issue 54's figures: slotserve beside llama-server on the same encoder GGUF files
(bench/retrieval_models.py), one server at a time, 2 threads each.

    python bench/retrieval_peer.py                          # every file and row
    python bench/retrieval_peer.py --files bert_base-q8_0 --rows ours --n-single 50

Per file and row, one JSON line (and $CACHE/retrieval/<file>-<row>.json):
- batch: one /v1/embeddings request of ``--n-batch`` inputs of 32-256 tokens (uniform,
  seeded; special tokens included): inputs/s.
- single: ``--n-single`` one-input requests from the same lengths, one after another:
  inputs/s and the median latency.
- rerank (a reranker file): one /v1/rerank of a query and ``--docs`` documents of 32-256
  tokens, ``--repeats`` times: the median seconds.
- rss: the server's VmRSS after the runs and its peak (VmHWM).

llama-server rows: ``llama-npN`` for each N of ``--llama-np`` (its default per-stream
KV, ``-c`` = N x 512, batch and micro-batch 2048, so every input fits one micro-batch)."""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("SLOTSERVE_PEER_CACHE", Path.home() / ".cache/slotserve-peer"))
WORDS = ["slot", "cache", "query", "window", "file", "the", "a", "of", "and", "retrieval"]  # one token each


def one_token_words(folder: Path) -> list[str]:
    """Up to ten words the folder's tokenizer reads as one token each after a space:
    ``WORDS`` where they are (the BERT and XLM-R tokenizers), else the vocabulary's
    word-initial pieces (Gemma's small bench tokenizer splits most of ``WORDS``)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    pieces = sorted(p[1:] for p in tok.get_vocab() if p.startswith("\u2581") and p[1:].isalpha())
    words = [w for w in dict.fromkeys(WORDS + pieces) if len(tok.encode(" " + w, add_special_tokens=False).ids) == 1]
    return words[:10]


def texts(n: int, seed: int, lo: int = 32, hi: int = 256, words: list[str] = WORDS) -> list[str]:
    """``n`` texts of lo..hi tokens with [CLS]/[SEP] (or <s>/</s>, <bos>/<eos>): words of one token."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(words) for _ in range(rng.randint(lo, hi) - 2)) for _ in range(n)]


def start(cmd: list[str], port: int, log: Path) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, stdout=open(log, "wb"), stderr=subprocess.STDOUT, start_new_session=True)  # noqa: SIM115
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: see {log}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"server did not come up: see {log}")


def stop(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def rss(pid: int) -> dict[str, int]:
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return {
        "rss_bytes": int(fields["VmRSS"].split()[0]) * 1024,
        "peak_rss_bytes": int(fields["VmHWM"].split()[0]) * 1024,
    }


def measure(url: str, args, rerank: bool, words: list[str]) -> dict:
    client = httpx.Client(base_url=url, timeout=3600)
    out: dict = {}
    if rerank:
        query, docs = texts(1, 7, 8, 16, words)[0], texts(args.docs, 8, words=words)
        client.post("/v1/rerank", json={"query": query, "documents": docs[:4]}).raise_for_status()  # warm-up
        times = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            r = client.post("/v1/rerank", json={"query": query, "documents": docs})
            times.append(time.perf_counter() - t)
            r.raise_for_status()
            assert len(r.json()["results"]) == args.docs
        out["rerank"] = {"docs": args.docs, "median_s": statistics.median(times), "runs_s": times}
        return out
    batch = texts(args.n_batch, 1, words=words)
    client.post("/v1/embeddings", json={"input": batch[:4]}).raise_for_status()  # warm-up
    t = time.perf_counter()
    r = client.post("/v1/embeddings", json={"input": batch})
    wall = time.perf_counter() - t
    r.raise_for_status()
    assert len(r.json()["data"]) == len(batch)
    tokens = r.json().get("usage", {}).get("prompt_tokens")  # both servers should read the same tokens
    out["batch"] = {"inputs": len(batch), "tokens": tokens, "seconds": wall, "inputs_per_s": len(batch) / wall}
    if not args.n_single:
        return out
    singles, latencies = texts(args.n_single, 2, words=words), []
    t = time.perf_counter()
    for text in singles:
        t1 = time.perf_counter()
        client.post("/v1/embeddings", json={"input": text}).raise_for_status()
        latencies.append(time.perf_counter() - t1)
    wall = time.perf_counter() - t
    out["single"] = {"inputs": len(singles), "inputs_per_s": len(singles) / wall,
                     "median_latency_s": statistics.median(latencies)}  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--files",
        nargs="*",
        default=[f"{m}-{t}" for m in ("bert_base", "xlmr_rerank", "gemma_embed") for t in ("f16", "q8_0")],
    )
    parser.add_argument("--rows", nargs="*", default=["llama", "ours"])
    parser.add_argument("--llama-np", nargs="*", type=int, default=[1, 4, 16])
    parser.add_argument("--n-batch", type=int, default=1000)
    parser.add_argument("--n-single", type=int, default=200)
    parser.add_argument("--docs", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    out_dir = CACHE / "retrieval"
    sys.path.insert(0, str(ROOT / "bench"))
    from retrieval_models import build

    paths = build(out_dir, tuple(dict.fromkeys(name.rsplit("-", 1)[0] for name in args.files)))
    for name in args.files:
        gguf, rerank = paths[name], name.startswith("xlmr_rerank")
        words = one_token_words(paths[name.rsplit("-", 1)[0]])
        runs = []
        for row in args.rows:
            if row == "llama":
                flags = ["--rerank"] if rerank else ["--embeddings"]
                for np_ in args.llama_np:
                    cmd = [str(CACHE / "llama-server"), "--port", "8193", "-m", str(gguf), "-t", "2", "-tb", "2"]
                    cmd += ["-np", str(np_), "-c", str(512 * np_), "-b", "2048", "-ub", "2048", "--no-webui", *flags]
                    runs.append((f"llama-np{np_}", cmd, 8193))
            else:
                cmd = [sys.executable, "-m", "server.cli", "serve", "--port", "8194", "-m", str(gguf), "-t", "2"]
                runs.append(("ours", cmd + (["--rerank"] if rerank else []), 8194))
        for row, cmd, port in runs:
            proc = start(cmd, port, out_dir / f"{name}-{row}.log")
            try:
                result = {
                    "file": name,
                    "row": row,
                    **measure(f"http://127.0.0.1:{port}", args, rerank, words),
                    **rss(proc.pid),
                }
            finally:
                stop(proc)
            line = json.dumps(result)
            (out_dir / f"{name}-{row}.json").write_text(line + "\n")
            print(line, flush=True)


if __name__ == "__main__":
    main()
