"""Lone UTF-16 surrogates in a JSON body: ``"\\ud800"`` is valid JSON, but no string
holding it can be encoded as UTF-8, so every later step (tokenizers, templates, the
answer's own JSON) would fail on it. The body gate (server/middleware/body_limit.py)
refuses such a body once, with a 400 naming the escape, on every route."""

from __future__ import annotations

import re

_ESCAPE = re.compile(rb"\\(?:u([0-9a-fA-F]{4})|.)", re.DOTALL)  # one escape; "\\\\" is one too


def lone_surrogate(body: bytes) -> str | None:
    """The first ``\\uXXXX`` escape of ``body`` that is a surrogate not in a high-low
    pair, as written; None when there is none (the usual case costs one ``find``)."""
    if b"\\u" not in body:
        return None
    pending = None  # a high surrogate waiting for its low half: (escape, end offset)
    for m in _ESCAPE.finditer(body):
        code = int(m.group(1), 16) if m.group(1) else None
        if pending is not None:
            if code is not None and 0xDC00 <= code <= 0xDFFF and m.start() == pending[1]:
                pending = None
                continue
            return pending[0]
        if code is None:
            continue
        if 0xD800 <= code <= 0xDBFF:
            pending = (m.group(0).decode(), m.end())
        elif 0xDC00 <= code <= 0xDFFF:
            return m.group(0).decode()
    return pending[0] if pending else None
