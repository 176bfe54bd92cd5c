"""Speculative decoding's workloads (issue 27) over held-out standard-library code,
through llama-server's native ``/completion``, ``--concurrency`` requests at a time,
against any server that speaks it. Prints JSON: output tok/s (client side), and from
``timings`` the tokens proposed and accepted.

    python bench/spec_bench.py http://127.0.0.1:8080 --concurrency 1 --requests 8 --new 128
    python bench/spec_bench.py http://127.0.0.1:8080 --workload complete

The code is the largest functions and methods (300 to 1,400 characters) of standard
library modules the demo model never saw (scripts/train_demo.py holds out every file
whose path hashes to 0 mod 20: csv, threading, socketserver, ...). ``repeat``: a
function, then "NAME_v2: the same as NAME" and its first line so renamed
(a model that learned code repeats the rest: what n-gram lookup proposes);
``complete``: a function's first half, to be continued (little to look up; a draft
model's ground).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from train_demo import is_heldout, stdlib_files  # noqa: E402

MODULES = ("csv.py", "threading.py", "socketserver.py", "sched.py", "getopt.py", "ntpath.py", "wave.py", "pool.py")


def functions(n: int) -> list[tuple[str, str]]:
    """(name, source) of the ``n`` largest functions and methods (300 to 1,400
    characters) of held-out modules, cycled when there are fewer."""
    found = []
    for path in stdlib_files():
        if path.name not in MODULES or not is_heldout(path):
            continue
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef):
                body = textwrap.dedent("\n".join(lines[node.lineno - 1 : node.end_lineno]))
                if 300 <= len(body) <= 1400:
                    found.append((node.name, body))
    found.sort(key=lambda f: (-len(f[1]), f[0]))
    return [found[i % len(found)] for i in range(n)]


def prompt(workload: str, name: str, body: str) -> str:
    """Both end inside a line (a trailing newline would end where the tokenizer merges
    it with the next line's indent, and the demo model goes astray)."""
    lines = body.splitlines()
    if workload == "repeat":
        return f"{body}\n\n\n# {name}_v2: the same as {name}\n{lines[0].replace(name, name + '_v2', 1)}"
    return "\n".join(lines[: max(2, len(lines) // 2)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("url")
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--workload", choices=("repeat", "complete"), default="repeat")
    args = ap.parse_args()
    prompts = [prompt(args.workload, name, body) for name, body in functions(args.requests)]

    def ask(prompt: str) -> dict:
        body = {"prompt": prompt, "n_predict": args.new, "temperature": 0, "cache_prompt": False}
        r = httpx.post(args.url + "/completion", json=body, timeout=600)
        r.raise_for_status()
        return r.json()

    ask(prompts[0])  # warm-up
    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.concurrency) as pool:
        answers = list(pool.map(ask, prompts))
    wall = time.perf_counter() - t0
    timings = [a["timings"] for a in answers]
    n_out = sum(t["predicted_n"] for t in timings)
    drafted = sum(t.get("draft_n", 0) for t in timings)
    accepted = sum(t.get("draft_n_accepted", 0) for t in timings)
    print(
        json.dumps(
            {
                "url": args.url,
                "workload": args.workload,
                "concurrency": args.concurrency,
                "requests": len(prompts),
                "output_tokens": n_out,
                "output_tok_s": round(n_out / wall, 2),
                "draft_n": drafted,
                "draft_n_accepted": accepted,
                "wall_s": round(wall, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
