"""llama-server's ``GET/POST /lora-adapters``: the loaded LoRA adapters (``--lora``,
``--lora-scaled``) and the scales requests that name none run with. A request's own
``lora`` field overrides them for that request (server/pipeline/generation.py)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi import Request as HTTPRequest

from server.errors import APIError
from server.schemas.answers import LoraAdapter, documented
from server.schemas.requests import LoraScale

router = APIRouter()


@router.get("/lora-adapters", response_model=None, responses=documented(list[LoraAdapter], 503))
async def list_adapters(http: HTTPRequest) -> list[dict]:
    state = http.app.state.slotserve
    engine = state.require_ready()
    paths = [path for path, _ in state.settings.lora_adapters]
    rows = zip(paths, state.lora_scales, engine.lora_labels)
    return [
        {"id": i, "path": p, "scale": s, "task_name": t, "prompt_prefix": x} for i, (p, s, (t, x)) in enumerate(rows)
    ]


@router.post("/lora-adapters", response_model=None, responses=documented(list[LoraAdapter], 400, 503))
async def set_adapters(body: list[LoraScale], http: HTTPRequest) -> list[dict]:
    """Every adapter's scale for requests that name none: the listed ones as given, the
    others 0 (as llama-server). Requests already running keep theirs."""
    state = http.app.state.slotserve
    state.require_ready()
    scales = [0.0] * len(state.lora_scales)
    for entry in body:
        if entry.id >= len(scales):
            raise APIError(400, f"no adapter with id {entry.id} ({len(scales)} loaded)", code="invalid_lora")
        scales[entry.id] = entry.scale
    state.lora_scales[:] = scales
    return await list_adapters(http)
