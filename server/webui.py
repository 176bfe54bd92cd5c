"""The web page at ``/``: a chat playground, a slot inspector and a live view, as static
files shipped in the package (server/static/, no build step). The page and its assets
load without the API key (the page asks for it and sends it with every API call);
``--no-webui`` (llama-server's ``--no-ui``) turns it off."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

STATIC = Path(__file__).parent / "static"
PUBLIC_PATHS = frozenset({"/"})
PUBLIC_PREFIX = "/ui/"

router = APIRouter()


@router.get("/", include_in_schema=False)
async def index() -> FileResponse:
    return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})


def mount(app: FastAPI) -> None:
    app.include_router(router)
    app.mount(PUBLIC_PREFIX.rstrip("/"), StaticFiles(directory=STATIC), name="ui")
