"""Record what llama-server renders for each built-in chat template name (its C++
formatter: ``--no-jinja --chat-template NAME``; with jinja on, llama-server reads a name
as template text) on a few conversations, into tests/data/llama_templates.json, the
table tests/llamacpp_compat/test_template_names.py compares slotserve against.

    python bench/llamacpp_tests/record_templates.py ~/.cache/slotserve-peer/llama-server model.gguf
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx

CONVERSATIONS = {
    "system": [
        {"role": "system", "content": "You are brief."},
        {"role": "user", "content": "Hello there"},
        {"role": "assistant", "content": "Hi! How can I help?"},
        {"role": "user", "content": "Name a color."},
    ],
    "user": [{"role": "user", "content": "Hello there"}],
    "turns": [
        {"role": "user", "content": " Hello "},
        {"role": "assistant", "content": "Hi!"},
        {"role": "user", "content": "Again?\n"},
    ],
}
OUT = Path(__file__).resolve().parents[2] / "tests" / "data" / "llama_templates.json"


def names(server: str) -> list[str]:
    """The built-in names, from llama-server's own help text."""
    text = subprocess.run([server, "--help"], capture_output=True, text=True).stdout
    out = []
    for line in text[text.index("list of built-in templates:") :].split("\n")[1:]:
        line = line.strip()
        if not re.fullmatch(r"[\w.\-]+(,\s*[\w.\-]+)*,?", line):
            break
        out += [n for n in re.split(r",\s*", line) if n]
    return out


def render(server: str, model: str, name: str, port: int = 18556) -> dict[str, str]:
    args = [server, "-m", model, "--port", str(port), "-c", "256", "-np", "1", "--no-jinja", "--chat-template", name]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        out = {}
        for key, messages in CONVERSATIONS.items():
            r = httpx.post(f"http://127.0.0.1:{port}/apply-template", json={"messages": messages}, timeout=60)
            out[key] = r.json()["prompt"] if r.status_code == 200 else None
        return out
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> None:
    server, model = sys.argv[1], sys.argv[2]
    table = {"conversations": CONVERSATIONS, "renderings": {n: render(server, model, n) for n in names(server)}}
    OUT.write_text(json.dumps(table, indent=1, ensure_ascii=False) + "\n")
    print(f"{len(table['renderings'])} names -> {OUT}")


if __name__ == "__main__":
    main()
