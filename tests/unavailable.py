"""What a test does when an outside part it needs (llama.cpp's converter, a browser)
cannot be had: it fails, naming the reason, so a green run never hides untested work;
it skips only when the named environment flag asks for that (``FLAG=1``)."""

from __future__ import annotations

import os

import pytest


def unavailable(reason: str, flag: str):
    """Fail the test with ``reason``, or skip it where ``$flag`` is 1. Never returns."""
    if os.environ.get(flag) == "1":
        pytest.skip(f"{reason} ({flag}=1)")
    pytest.fail(f"{reason}; set {flag}=1 to skip these tests instead", pytrace=False)
