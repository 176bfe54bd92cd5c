"""What each path is, in one table: the API-key check, idle sleep, the web page and the
cross-site rule all read it (the model server's and the router's).

- ``public``: served without the API key (the probes; the web page's files);
  ``/metrics`` too with ``--metrics-public``.
- ``wakes``: a request here needs the model, so it wakes a sleeping one and counts
  as activity; the others answer from what the server knows without the model.
- ``page``: part of the web page, served only with ``--webui``.
- ``guarded``: changes or shows the server's state (slots, slot files, LoRA scales,
  the CORS proxy, the router's model loading): a request a browser sends from another
  site is refused unless ``--cors-origins`` names that origin (not ``*``) or the server
  has an API key (server/middleware/cross_site.py), whatever its method.

A path matches its exact entry, else the longest entry ending in ``/`` it starts with;
any other path is an API route: behind the key, wakes the model, not guarded."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PathRule:
    path: str  # exact, or a prefix when it ends with "/"
    public: bool = False
    wakes: bool = True
    page: bool = False
    guarded: bool = False


RULES = (
    PathRule("/health", public=True, wakes=False),
    PathRule("/ready", public=True, wakes=False),
    PathRule("/metrics", wakes=False),
    PathRule("/props", wakes=False),
    PathRule("/v1/models", wakes=False),
    PathRule("/models", wakes=False),
    PathRule("/openapi.json", wakes=False),
    PathRule("/", public=True, wakes=False, page=True),
    PathRule("/sw.js", public=True, wakes=False, page=True),
    PathRule("/manifest.webmanifest", public=True, wakes=False, page=True),
    PathRule("/_app/version.json", public=True, wakes=False, page=True),
    PathRule("/ui/", public=True, wakes=False, page=True),
    PathRule("/live", wakes=False, page=True),
    PathRule("/slots", guarded=True),
    PathRule("/slots/", guarded=True),
    PathRule("/lora-adapters", guarded=True),
    PathRule("/cors-proxy", wakes=False, guarded=True),
    PathRule("/models/load", wakes=False, guarded=True),  # the router's
    PathRule("/models/unload", wakes=False, guarded=True),
    PathRule("/models/reload", wakes=False, guarded=True),
)
_EXACT = {r.path: r for r in RULES if not r.path.endswith("/") or r.path == "/"}
_PREFIXES = sorted((r for r in RULES if r.path.endswith("/") and r.path != "/"), key=lambda r: -len(r.path))
API = PathRule("")  # any other path


def rule(path: str) -> PathRule:
    exact = _EXACT.get(path)
    if exact is not None:
        return exact
    return next((r for r in _PREFIXES if path.startswith(r.path)), API)


class PublicPaths:
    """Which paths need no API key, for one server's settings."""

    def __init__(self, webui: bool, metrics_public: bool):
        self.webui, self.metrics_public = webui, metrics_public

    def __call__(self, path: str) -> bool:
        r = rule(path)
        if r.page and not self.webui:
            return False
        return r.public or (self.metrics_public and path == "/metrics")

    def exact(self) -> frozenset[str]:
        """The public paths that are not prefixes (the OpenAPI document marks them)."""
        return frozenset(p for p in _EXACT if self(p))
