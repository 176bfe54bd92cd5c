"""Speculative decoding's workload (issue 27): "repeat this function with one change"
prompts over standard-library code, through llama-server's native ``/completion``,
``--concurrency`` requests at a time; against any server that speaks it. Prints JSON:
output tok/s (client side), and from ``timings`` the tokens proposed and accepted.

    python bench/spec_bench.py http://127.0.0.1:8080 --concurrency 1 --requests 8 --new 128

Each prompt is a function's source (the standard library's ``textwrap``, ``shlex`` and
``string`` modules, largest first, cut to 1,400 characters), then the same function's
first line again: a model
that learned code repeats it, which is what n-gram lookup proposes.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import json
import shlex
import string
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor

import httpx


def functions(n: int) -> list[str]:
    """The sources of the ``n`` largest top-level functions of a few stdlib modules."""
    out = []
    for module in (textwrap, shlex, string):
        tree = ast.parse(inspect.getsource(module))
        src = inspect.getsource(module).splitlines()
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.ClassDef):
                out.append("\n".join(src[node.lineno - 1 : node.end_lineno]))
    return sorted(out, key=len, reverse=True)[:n]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("url")
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--new", type=int, default=128)
    args = ap.parse_args()
    prompts = []
    for fn in functions(args.requests):
        body = fn[:1400]  # twice in the prompt, with the answer, within the demo model's 1,024 positions
        prompts.append(f"{body}\n\n\n# the same, once more\n{body.splitlines()[0]}\n")

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
