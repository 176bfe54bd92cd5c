"""Slot files over HTTP: llama-server's ``POST /slots/{id}?action=save|restore|erase``
and ours, ``GET /slots/files`` and ``DELETE /slots/files/{filename}``.

File I/O, encoding and checksums run in worker threads; only the snapshot (a copy of
the slot's cells) and the restore into memory run on the engine thread, between steps.
A restore reads and validates the whole file before it asks the engine thread for
anything, so a bad file changes nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query
from fastapi import Request as HTTPRequest
from pydantic import BaseModel, ConfigDict, Field

from engine import MAX_NAME_CHARS, NAME_PATTERN, EngineService, SlotBusy, SlotFiles
from server.errors import APIError
from server.schemas.answers import Deleted, SlotActionResult, SlotFileList, documented
from server.telemetry import progress
from server.telemetry.progress import ProgressLine

router = APIRouter()
NAME_RULE = {"minLength": 1, "maxLength": MAX_NAME_CHARS, "pattern": NAME_PATTERN}  # what check_name enforces
FileName = Annotated[str, Field(description="one path component inside --slot-save-path", json_schema_extra=NAME_RULE)]


class SlotActionBody(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    filename: FileName | None = Field(None, description="save/restore: the file (default slot-<id>.slot)")


def _files(http: HTTPRequest) -> SlotFiles:
    files = http.app.state.slotserve.slot_files
    if files is None:
        raise APIError(501, "slot files are off: start the server with --slot-save-path", "not_supported_error")
    return files


SLOT = Path(ge=0, description="the slot", json_schema_extra={"x-limit": "slot"})
FILE = Path(description="a slot file's name", json_schema_extra=NAME_RULE)


@router.post(
    "/slots/{id_slot:int}",  # digits only: POST /slots/files is 405, not a bad slot id
    response_model=None,
    responses=documented(SlotActionResult, 400, 404, 409, 413, 501, 503, 507),
)
async def slot_action(
    id_slot: Annotated[int, SLOT],
    http: HTTPRequest,
    action: Annotated[Literal["save", "restore", "erase"], Query()],
    body: SlotActionBody | None = None,
    nowait: Annotated[bool, Query(description="409 at once instead of waiting for a busy slot")] = False,
) -> dict:
    engine = http.app.state.slotserve.require_ready()
    files = _files(http)
    slot = engine.check_slot(id_slot)
    metrics = http.app.state.slotserve.metrics
    try:
        name = body.filename if body is not None and body.filename is not None else f"slot-{slot}.slot"
        filename = files.check_name(name)  # checked for every action, erase too
        result = await _run_action(engine, slot, action, filename, nowait)
    except Exception:
        metrics.slot_file_ops.labels(action, "error").inc()
        raise
    metrics.slot_file_ops.labels(action, "ok").inc()
    if action == "save":
        metrics.slot_file_written.inc(result["n_written"])
        metrics.slot_save_time.observe(result["timings"]["save_ms"] / 1000)
    elif action == "restore":
        metrics.slot_file_read.inc(result["n_read"])
        metrics.slot_restore_time.observe(result["timings"]["restore_ms"] / 1000)
    return result


async def _run_action(engine: EngineService, slot: int, action: str, filename: str, nowait: bool) -> dict:
    t0 = time.perf_counter()
    ms = lambda: (time.perf_counter() - t0) * 1000  # noqa: E731
    try:
        if action == "save":
            report = ProgressLine(f"saving slot {slot} to {filename}", min_bytes=progress.SLOT_FILE_MIN_BYTES)
            saved = await engine.save_slot(slot, filename, report.bytes)
            return {
                "id_slot": slot,
                "filename": filename,
                "n_saved": saved.n_saved,
                "n_written": saved.n_written,
                "timings": {"save_ms": ms()},
            }
        if action == "restore":
            report = ProgressLine(f"restoring slot {slot} from {filename}", min_bytes=progress.SLOT_FILE_MIN_BYTES)
            restored = await engine.restore_slot(slot, filename, nowait, report.bytes)
            return {
                "id_slot": slot,
                "filename": filename,
                "n_restored": restored.n_restored,
                "n_read": restored.n_read,
                "timings": {"restore_ms": ms()},
            }
        return {"id_slot": slot, "n_erased": await engine.erase_slot(slot, nowait)}
    except SlotBusy as exc:
        hint = "; retry, or leave out nowait to wait for it" if nowait else ""
        raise APIError(409, f"{exc}{hint}", code="slot_busy") from None


@router.get("/slots/files", response_model=None, responses=documented(SlotFileList, 501, 503))
async def list_files(http: HTTPRequest) -> dict:
    engine = http.app.state.slotserve.require_ready()
    entries = await asyncio.to_thread(_files(http).list, engine.fingerprint)
    return {"object": "list", "data": [dataclasses.asdict(e) for e in entries]}


@router.delete("/slots/files/{filename}", response_model=None, responses=documented(Deleted, 400, 404, 501))
async def delete_file(filename: Annotated[str, FILE], http: HTTPRequest) -> dict:
    files = _files(http)
    ops = http.app.state.slotserve.metrics.slot_file_ops
    try:
        await asyncio.to_thread(files.delete, filename)
    except Exception:
        ops.labels("delete", "error").inc()
        raise
    ops.labels("delete", "ok").inc()
    return {"filename": filename, "deleted": True}
