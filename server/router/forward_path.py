"""The path the router forwards to a child: the one its guards judged.

The API-key check and the cross-site rule (server/middleware/) judge the request's
decoded path. Forwarded as that string, a child's HTTP stack would parse it again: a
``#`` or ``?`` that was percent-encoded would start a fragment or a query, and dot
segments would be collapsed, so ``/slots%23`` or ``/v1%2F..%2Fslots`` would reach
``/slots`` having been judged as another path. A decoded path that is not a route's
own spelling is refused here (400), and the rest is percent-encoded again, so the
child decodes exactly the string the guards judged.
"""

from __future__ import annotations

from urllib.parse import quote

from server.errors import APIError

_NOT_IN_A_ROUTE = set("#?\\") | {chr(c) for c in range(32)} | {chr(127)}


def forward_path(path: str) -> str:
    """``path`` (decoded, starting with ``/``) percent-encoded for the child. Raises
    APIError 400 when it holds what no route's path holds: ``#``, ``?``, a backslash,
    control characters, an empty, ``.`` or ``..`` segment."""
    segments = path.split("/")[1:]
    bad = next((c for c in path if c in _NOT_IN_A_ROUTE), None)
    if bad is not None or any(s in (".", "..") for s in segments) or "" in segments[:-1]:
        what = f"the character {bad!r}" if bad is not None else "an empty or dot segment"
        raise APIError(400, f"the path {path!r} holds {what}: no route is spelled so")
    return quote(path, safe="/:@!$&'()*+,;=-._~")
