"""One model a router serves: what its child server loads and with which flags."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class ModelEntry:
    name: str
    path: Path  # what the child's -m takes
    mmproj: Path | None = None
    args: tuple[str, ...] = field(default=())  # the preset's flags for this model
    hidden: bool = False  # left out of /models (a preset's dedup-cache-models), still served
