"""docs/architecture.md's layout block is the tree's (scripts/layout_doc.py): a module
added, moved or renamed, or a docstring's first sentence changed, shows here until the
block is written again."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import layout_doc  # noqa: E402


def test_the_layout_block_is_the_trees():
    block = layout_doc.page_block(layout_doc.PAGE.read_text(encoding="utf-8"))
    assert block is not None, "docs/architecture.md lost its layout markers"
    assert block == layout_doc.render(), "the layout changed: run `python scripts/layout_doc.py --write`"


def test_the_block_names_every_module():
    rendered = layout_doc.render()
    for package in layout_doc.PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if path.name != "__init__.py":
                assert f" {path.stem} " in rendered, path
