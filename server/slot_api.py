"""Slot files over HTTP: llama-server's ``POST /slots/{id}?action=save|restore|erase``
and ours, ``GET /slots/files`` and ``DELETE /slots/files/{filename}``.

File I/O, encoding and checksums run in worker threads; only the snapshot (a copy of
the slot's cells) and the restore into memory run on the engine thread, between steps.
A restore reads and validates the whole file before it asks the engine thread for
anything, so a bad file changes nothing.
"""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query
from fastapi import Request as HTTPRequest
from pydantic import BaseModel, ConfigDict, Field

from engine import slot_io
from engine.scheduler import Scheduler, SlotBusy
from memory import CacheFull, StateMismatch
from memory.slot_dir import MAX_NAME_CHARS, NAME_PATTERN, BadFileName, FileMissing, SlotDirectory, check_name
from memory.slot_file import SlotFile, SlotFileError, decode, encode, fingerprint_mismatch, fingerprint_of
from server.errors import APIError
from server.responses import Deleted, SlotActionResult, SlotFileList, documented

router = APIRouter()
NAME_RULE = {"minLength": 1, "maxLength": MAX_NAME_CHARS, "pattern": NAME_PATTERN}  # what check_name enforces
FileName = Annotated[str, Field(description="one path component inside --slot-save-path", json_schema_extra=NAME_RULE)]


class SlotActionBody(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    filename: FileName | None = Field(None, description="save/restore: the file (default slot-<id>.slot)")


def _directory(http: HTTPRequest) -> SlotDirectory:
    directory = http.app.state.slotserve.slot_dir
    if directory is None:
        raise APIError(501, "slot files are off: start the server with --slot-save-path", "not_supported_error")
    return directory


def _slot_id(id_slot: int, scheduler: Scheduler) -> int:
    n = len(scheduler.table)
    if not 0 <= id_slot < n:
        raise APIError(400, f"slot id {id_slot} out of range [0, {n})", code="invalid_id_slot")
    return id_slot


def _filename(body: SlotActionBody | None, slot: int) -> str:
    name = body.filename if body is not None and body.filename is not None else f"slot-{slot}.slot"
    try:
        return check_name(name)
    except BadFileName as exc:
        raise APIError(400, str(exc), code="invalid_filename") from None


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
    scheduler = http.app.state.slotserve.require_ready()
    directory = _directory(http)
    slot = _slot_id(id_slot, scheduler)
    metrics = http.app.state.slotserve.metrics
    try:
        filename = _filename(body, slot)  # checked for every action, erase too
        result = await _run_action(scheduler, directory, slot, action, filename, nowait)
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


async def _run_action(
    scheduler: Scheduler, directory: SlotDirectory, slot: int, action: str, filename: str, nowait: bool
) -> dict:
    try:
        if action == "save":
            return await _save(scheduler, directory, slot, filename)
        if action == "restore":
            return await _restore(scheduler, directory, slot, filename, nowait)
        n_erased = await scheduler.call(lambda: slot_io.erase(scheduler.board, slot), idle_slot=slot, wait=not nowait)
        return {"id_slot": slot, "n_erased": n_erased}
    except SlotBusy as exc:
        raise APIError(409, f"{exc}; retry, or leave out nowait to wait for it", code="slot_busy") from None
    except slot_io.SlotNotReady as exc:
        raise APIError(409, str(exc), code="slot_busy") from None


async def _save(scheduler: Scheduler, directory: SlotDirectory, slot: int, filename: str) -> dict:
    t0 = time.perf_counter()
    tokens, state = await scheduler.call(lambda: slot_io.snapshot(scheduler.board, slot))
    data = await asyncio.to_thread(encode, tokens, state, scheduler.engine.fingerprint)
    try:
        n_written = await asyncio.to_thread(directory.write, filename, data)
    except BadFileName as exc:
        raise APIError(400, str(exc), code="invalid_filename") from None
    except IsADirectoryError:
        raise APIError(400, f"{filename!r} is a directory", code="invalid_filename") from None
    except OSError as exc:
        raise APIError(507, f"writing the slot file failed: {exc.strerror}", "server_error", "write_failed") from None
    save_ms = (time.perf_counter() - t0) * 1000
    return {
        "id_slot": slot,
        "filename": filename,
        "n_saved": len(tokens),
        "n_written": n_written,
        "timings": {"save_ms": save_ms},
    }


def _read_valid(directory: SlotDirectory, filename: str, scheduler: Scheduler) -> tuple[SlotFile, int]:
    """Read and check everything but the fit into memory; raises APIError 400."""
    try:
        data = directory.read(filename)
        file = decode(data)
    except SlotFileError as exc:
        if isinstance(exc, FileMissing):
            raise APIError(404, str(exc), code="file_not_found") from None
        code = "invalid_filename" if isinstance(exc, BadFileName) else "invalid_slot_file"
        raise APIError(400, str(exc), code=code) from None
    engine = scheduler.engine
    reason = fingerprint_mismatch(file.fingerprint, engine.fingerprint)
    if reason:
        raise APIError(400, reason, code="model_mismatch")
    vocab, n_ctx = engine.model_config.vocab_size, engine.n_ctx_seq
    if file.tokens and (min(file.tokens) < 0 or max(file.tokens) >= vocab):
        raise APIError(400, f"the file holds token ids outside the vocabulary [0, {vocab})", code="invalid_slot_file")
    if len(file.tokens) > n_ctx:
        raise APIError(
            400,
            f"the file holds {len(file.tokens)} tokens but the slot's context is {n_ctx}",
            "exceed_context_size_error",
            n_prompt_tokens=len(file.tokens),
            n_ctx=n_ctx,
        )
    return file, len(data)


async def _restore(scheduler: Scheduler, directory: SlotDirectory, slot: int, filename: str, nowait: bool) -> dict:
    t0 = time.perf_counter()
    file, n_read = await asyncio.to_thread(_read_valid, directory, filename, scheduler)

    def load() -> None:
        slot_io.restore(scheduler.board, slot, file.tokens, file.state)

    try:
        await scheduler.call(load, idle_slot=slot, wait=not nowait)
    except StateMismatch as exc:
        raise APIError(400, f"the file does not fit this server's cache: {exc}", code="invalid_slot_file") from None
    except CacheFull as exc:
        raise APIError(503, f"not enough free cache to restore: {exc}", headers={"Retry-After": "1"}) from None
    restore_ms = (time.perf_counter() - t0) * 1000
    return {
        "id_slot": slot,
        "filename": filename,
        "n_restored": len(file.tokens),
        "n_read": n_read,
        "timings": {"restore_ms": restore_ms},
    }


@router.get("/slots/files", response_model=None, responses=documented(SlotFileList, 501, 503))
async def list_files(http: HTTPRequest) -> dict:
    scheduler = http.app.state.slotserve.require_ready()
    entries = await asyncio.to_thread(_directory(http).list)
    ours = scheduler.engine.fingerprint
    data = []
    for e in entries:
        fingerprint = fingerprint_of(e.meta)
        data.append(
            {
                "filename": e.filename,
                "size": e.size,
                "n_tokens": e.n_tokens,
                "created": e.created,
                "memory_kind": e.meta.get("memory.memory_kind"),
                "model": fingerprint,
                "model_match": fingerprint_mismatch(fingerprint, ours) is None,
            }
        )
    return {"object": "list", "data": data}


@router.delete("/slots/files/{filename}", response_model=None, responses=documented(Deleted, 400, 404, 501))
async def delete_file(filename: Annotated[str, FILE], http: HTTPRequest) -> dict:
    directory = _directory(http)
    ops = http.app.state.slotserve.metrics.slot_file_ops
    try:
        await asyncio.to_thread(directory.delete, filename)
    except FileMissing as exc:
        ops.labels("delete", "error").inc()
        raise APIError(404, str(exc), code="file_not_found") from None
    except SlotFileError as exc:
        ops.labels("delete", "error").inc()
        code = "invalid_filename" if isinstance(exc, BadFileName) else "not_a_slot_file"
        raise APIError(400, str(exc), code=code) from None
    ops.labels("delete", "ok").inc()
    return {"filename": filename, "deleted": True}
