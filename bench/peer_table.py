"""The table of bench/peer_llamacpp.sh: every row it ran (with the server's resident
memory after the run and its peak), slotserve's ratios against the best llama-server
F32 row (and the F16 row), and for each GGUF both servers ran, ours / llama-server's.

    python bench/peer_table.py ~/.cache/slotserve-peer/88m            # the 128-token-prompt run
    python bench/peer_table.py ~/.cache/slotserve-peer/88m -pp512     # a run with TAG=-pp512
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# the same-file rows: llama-<file> and ours-<file>
FILES = ["f16", "q8_0", "q4_k_m", "q5_k_m", "q6_k", "q4_0", "iq4_xs"]
ROWS = ["llama-f32", "llama-f32-unified", "slotserve", "slotserve-unified"]
ROWS += [f"{who}-{f}" for f in FILES for who in ("llama", "ours")]
PEERS_F32 = ["llama-f32", "llama-f32-unified"]


def main() -> None:
    cache, tag = Path(sys.argv[1]), (sys.argv[2] if len(sys.argv) > 2 else "")
    files = {n: cache / f"{n}{tag}.json" for n in ROWS}
    rows = {n: json.loads(f.read_text())["levels"] for n, f in files.items() if f.exists()}
    memory = {n: json.loads(f.read_text()) for n, f in files.items() if f.exists()}
    levels = [lv["concurrency"] for lv in next(iter(rows.values()))]
    cols = [f"c={c} {what}" for what in ("tok/s", "TTFT p50 ms", "ITL p50 ms") for c in levels]
    print("| row | " + " | ".join(cols) + " | RSS MB | peak RSS MB |")
    print("|---" + "|---:" * (len(cols) + 2) + "|")
    for name, lv in rows.items():
        cells = [f"{x['output_tok_s']:.1f}" for x in lv]
        cells += [f"{x['ttft_ms_p50']:,.0f}" for x in lv]
        cells += [f"{x['itl_ms_p50']:.1f}" for x in lv]
        cells += [f"{memory[name].get(k, 0) / 1e6:,.0f}" for k in ("rss_bytes", "peak_rss_bytes")]
        print(f"| {name} | " + " | ".join(cells) + " |")
    print()
    for f in FILES:  # the same file in both servers
        ours, peer = rows.get(f"ours-{f}"), rows.get(f"llama-{f}")
        if ours and peer:
            ratios = [f"c={a['concurrency']} {a['output_tok_s'] / b['output_tok_s']:.2f}x" for a, b in zip(ours, peer)]
            ttft = [f"{a['ttft_ms_p50'] / b['ttft_ms_p50']:.2f}x" for a, b in zip(ours, peer)]
            rss = memory[f"ours-{f}"].get("rss_bytes", 0) - memory[f"llama-{f}"].get("rss_bytes", 0)
            print(f"{f}: ours / llama-server tok/s {', '.join(ratios)}; TTFT p50 {', '.join(ttft)};"
                  f" resident {rss / 1e6:+,.0f} MB")  # fmt: skip
    print()
    for name in ("slotserve", "slotserve-unified"):
        for x in rows.get(name, []):
            if "engine_offcpu_share" in x:
                print(
                    f"{name} c={x['concurrency']}: engine step {x['engine_step_ms_mean']:.1f} ms mean,"
                    f" engine thread off the CPU {x['engine_offcpu_share']:.1%} of it"
                )
    peers = [n for n in PEERS_F32 if n in rows]
    for i, c in enumerate(levels if peers else []):
        best = max(peers, key=lambda n: rows[n][i]["output_tok_s"])
        for ours_name in ("slotserve", "slotserve-unified"):
            if ours_name not in rows:
                continue
            ours, peer = rows[ours_name][i], rows[best][i]
            speed = ours["output_tok_s"] / peer["output_tok_s"]
            line = f"c={c}: {ours_name} / best F32 peer ({best}): {speed:.2f}x tok/s,"
            line += f" TTFT p50 {ours['ttft_ms_p50'] / peer['ttft_ms_p50']:.2f}x"
            if "llama-f16" in rows:
                line += f"; / llama-f16: {ours['output_tok_s'] / rows['llama-f16'][i]['output_tok_s']:.2f}x tok/s"
            print(line)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
