"""The web page at ``/``: a chat playground, a slot inspector and a live view, as static
files shipped in the package (server/static/, no build step). The page and its assets
load without the API key (the page asks for it and sends it with every API call), as do
the web-app files clients ask for (``/manifest.webmanifest``, ``/sw.js``,
``/_app/version.json``);
``--no-webui`` (llama-server's ``--no-ui``) turns it off.

The live view reads ``GET /live`` (behind the API key, as every API route): four
numbers as JSON, served whether or not ``--metrics`` is on, so the view works on a
default start while ``/metrics`` stays the operator's choice (off by default, as in
llama-server)."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi import Request as HTTPRequest
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from server import __version__

STATIC = Path(__file__).parent.parent / "static"
ASSETS = "/ui"  # the page's files (public, as the page's paths: server/middleware/paths.py)

router = APIRouter()


@router.get("/", include_in_schema=False)
async def index() -> FileResponse:
    return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})


@router.get("/manifest.webmanifest", include_in_schema=False)
async def manifest() -> FileResponse:
    return FileResponse(STATIC / "manifest.webmanifest", media_type="application/manifest+json")


@router.get("/sw.js", include_in_schema=False)
async def service_worker() -> FileResponse:
    return FileResponse(STATIC / "sw.js", media_type="text/javascript", headers={"Cache-Control": "no-cache"})


@router.get("/_app/version.json", include_in_schema=False)
async def version() -> dict:
    """The page's version, where web-app clients look for it (as llama-server's page)."""
    return {"version": __version__}


@router.get("/live", include_in_schema=False)
async def live(http: HTTPRequest) -> dict:
    """What the live view shows: tokens generated so far (the page takes the rate),
    requests running and waiting, cache bytes in use and in all (null before the model
    is loaded)."""
    state = http.app.state.slotserve
    engine = state.engine if state.status == "ready" else None
    out = {"generated_tokens": state.metrics.n_generated, "requests_running": None, "requests_waiting": None}
    out |= {"cache_bytes_used": None, "cache_bytes_capacity": None}
    if engine is not None:
        health, usage = engine.health(), engine.cache_stats().usage
        out |= {"requests_running": health.n_running, "requests_waiting": health.n_waiting}
        out["cache_bytes_used"] = sum(g.bytes_used for g in usage.groups)
        out["cache_bytes_capacity"] = sum(g.bytes_total for g in usage.groups)
    return out


def mount(app: FastAPI) -> None:
    app.include_router(router)
    app.mount(ASSETS, StaticFiles(directory=STATIC), name="ui")
