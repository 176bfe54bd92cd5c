"""Figures for docs/benchmarks.md, drawn with matplotlib from what the bench scripts
write (their --json / --out files, or the per-row files of bench/peer_llamacpp.sh).

    python bench/plot.py peer bench/results/peer-2026-11-23     # tok/s and TTFT vs concurrency
    python bench/plot.py engine bench/results/engine.json       # engine vs transformers generate
    python bench/plot.py slots bench/results/slot-*.json        # slot restore vs prefill
    python bench/plot.py memory                                  # bytes per slot by memory kind

Each writes docs/bench-<name>.png (``--out`` to put it elsewhere). Needs matplotlib
(``pip install -e '.[bench]'``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

PEER_ROWS = {  # file stem -> label, line style (slotserve solid, llama-server dashed)
    "slotserve": ("slotserve (per-stream, default)", "-"),
    "slotserve-unified": ("slotserve --kv-unified", "-"),
    "llama-f32": ("llama-server F32 (per-stream, default)", "--"),
    "llama-f32-unified": ("llama-server F32 --kv-unified", "--"),
    "llama-f16": ("llama-server F16", ":"),
}


def peer(folder: Path, out: Path) -> None:
    fig, (tput, ttft) = plt.subplots(1, 2, figsize=(11, 4.2))
    for stem, (label, style) in PEER_ROWS.items():
        path = folder / f"{stem}.json"
        if not path.is_file():
            continue
        levels = json.loads(path.read_text())["levels"]
        c = [lv["concurrency"] for lv in levels]
        tput.plot(c, [lv["output_tok_s"] for lv in levels], style, marker="o", label=label)
        ttft.plot(c, [lv["ttft_ms_p50"] / 1000 for lv in levels], style, marker="o", label=label)
    for ax, title, unit in ((tput, "output throughput", "tokens/s"), (ttft, "time to first token, p50", "s")):
        ax.set(title=title, xlabel="concurrent streams", ylabel=unit, xscale="log", xticks=[1, 8, 32])
        ax.set_xticklabels(["1", "8", "32"])
        ax.grid(alpha=0.3)
    tput.legend(fontsize=8)
    fig.suptitle("88M-parameter Llama, 128-token prompts, 128 new tokens, 2 CPU cores (bench/peer_llamacpp.sh)")
    _save(fig, out)


def engine(path: Path, out: Path) -> None:
    data = json.loads(path.read_text())
    rows = data["rows"]
    batches = [str(r["batch"]) for r in rows]
    x = range(len(rows))
    fig, ax = plt.subplots(figsize=(6.5, 4))
    ax.bar([i - 0.2 for i in x], [r["slotserve_tok_s"] for r in rows], 0.4, label="slotserve engine")
    ax.bar([i + 0.2 for i in x], [r["transformers_tok_s"] for r in rows], 0.4, label="transformers generate")
    for i, r in zip(x, rows):
        ax.annotate(f"{r['slotserve_tok_s'] / r['transformers_tok_s']:.2f}x", (i - 0.2, r["slotserve_tok_s"]),
                    ha="center", va="bottom", fontsize=8)  # fmt: skip
    ax.set_xticks(list(x))
    ax.set_xticklabels(batches)
    ax.set(xlabel="batch (sequences)", ylabel="tokens/s", title=f"{data['params_m']:.0f}M-parameter Llama, float32")
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    _save(fig, out)


def slots(paths: list[Path], out: Path) -> None:
    runs = sorted((json.loads(p.read_text()) for p in paths), key=lambda r: r["prompt_tokens"])
    x = range(len(runs))
    fig, ax = plt.subplots(figsize=(6.5, 4))
    ax.bar([i - 0.2 for i in x], [r["cold_request_s"] for r in runs], 0.4, label="prefill the conversation")
    both = [r["restore_request_s"] + r["warm_request_s"] for r in runs]
    ax.bar([i + 0.2 for i in x], both, 0.4, label="restore its slot file + ask")
    ax.set_xticks(list(x))
    ax.set_xticklabels([f"{r['prompt_tokens']:,}" for r in runs])
    ax.set(xlabel="conversation length (tokens)", ylabel="seconds to the first token", title="slot restore vs prefill")
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    _save(fig, out)


def memory(out: Path) -> None:
    import hybrid_bench
    import layout_bench

    gemma = layout_bench.kv_bytes()
    granite = hybrid_bench.part_memory()["bfloat16"]
    labels = [
        "Gemma-3-4B shape:\nfull attention",
        "Gemma-3-4B shape:\niSWA rings",
        "Gemma-3-4B shape:\n--swa-full",
        "Granite-4 shape:\nattention everywhere",
        "Granite-4 shape:\nhybrid (Mamba2)",
        "Granite-4 hybrid:\nits states",
    ]
    values = [gemma["all_full"]["bytes_per_slot"], gemma["iswa"]["bytes_per_slot"], gemma["swa_full"]["bytes_per_slot"],
              granite["attention_only"], granite["hybrid"], granite["states"]]  # fmt: skip
    colors = ["#888", "#2a7", "#999", "#888", "#27a", "#7ad"]
    fig, ax = plt.subplots(figsize=(10, 4.4))
    bars = ax.bar(range(len(values)), [v / 2**20 for v in values], color=colors)
    ax.bar_label(bars, fmt="%.0f MiB", fontsize=8)
    ax.set_xticks(range(len(values)))
    ax.set_xticklabels(labels, fontsize=8)
    ax.axvline(2.5, color="k", lw=0.5)
    ax.set(ylabel="MiB per slot at 8,192 tokens, bfloat16", title="memory per slot by memory kind")
    ax.grid(axis="y", alpha=0.3)
    _save(fig, out)


def _save(fig, out: Path) -> None:
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["peer", "engine", "slots", "memory"])
    ap.add_argument("inputs", nargs="*", type=Path)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    out = args.out or ROOT / "docs" / f"bench-{args.what}.png"
    if args.what == "peer":
        peer(args.inputs[0], out)
    elif args.what == "engine":
        engine(args.inputs[0], out)
    elif args.what == "slots":
        slots(args.inputs, out)
    else:
        memory(out)


if __name__ == "__main__":
    main()
