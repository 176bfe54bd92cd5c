"""bench/plot.py draws every figure docs/benchmarks.md shows, from the results kept in
bench/results/, and the page shows each figure that is there."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


@pytest.mark.parametrize(
    "what, inputs",
    [
        ("peer", [RESULTS / "peer-2026-11-23"]),
        ("engine", [RESULTS / "engine.json"]),
        ("slots", sorted(RESULTS.glob("slot-*.json"))),
        ("memory", []),
    ],
)
def test_each_figure_is_drawn_from_the_kept_results(tmp_path, what, inputs):
    out = tmp_path / f"{what}.png"
    cmd = [sys.executable, str(ROOT / "bench" / "plot.py"), what, *map(str, inputs), "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


def test_the_benchmark_page_shows_every_figure():
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    shown = set(re.findall(r"!\[[^\]]*\]\((bench-[a-z]+\.png)\)", page))
    drawn = {p.name for p in (ROOT / "docs").glob("bench-*.png")}
    assert shown == drawn == {"bench-peer.png", "bench-engine.png", "bench-slots.png", "bench-memory.png"}
