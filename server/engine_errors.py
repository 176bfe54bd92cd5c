"""The engine's errors as HTTP answers: a slot error's status (its code and extra fields
kept), a request the engine refuses, a tokenizer that cannot encode, a stopping engine.
Installed by the model server's app beside server/errors.py's handlers."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from engine import (
    BadSlotFile,
    EngineStopped,
    NoRoom,
    RequestError,
    SlotBusy,
    SlotError,
    SlotFileMissing,
    SlotFilesOff,
    SlotWriteFailed,
    TokenizeError,
)
from server.errors import APIError, answer

_SLOT_STATUS = {  # most specific first
    SlotBusy: 409,
    SlotFilesOff: 501,
    SlotFileMissing: 404,
    BadSlotFile: 400,
    SlotWriteFailed: 507,
    NoRoom: 503,
    SlotError: 400,
}


def slot_error(exc: SlotError) -> APIError:
    """The HTTP form of an engine slot error (its code and extra fields kept)."""
    status = next(code for cls, code in _SLOT_STATUS.items() if isinstance(exc, cls))
    code, type_ = exc.code, "server_error" if status == 507 else None
    if code == "exceed_context_size_error":  # llama-server's shape: the type names it, the code is 400
        code, type_ = None, code
    headers = {"Retry-After": "1"} if status == 503 else None
    return APIError(status, str(exc), type_, code, headers, **exc.extra)


def install(app: FastAPI) -> None:
    @app.exception_handler(TokenizeError)
    async def _untokenizable(request: Request, exc: TokenizeError) -> JSONResponse:
        return answer(request, APIError(400, str(exc)))

    @app.exception_handler(RequestError)
    async def _refused(request: Request, exc: RequestError) -> JSONResponse:  # what can never run: the engine says why
        return answer(request, APIError(400, str(exc), exc.type, **exc.extra))

    @app.exception_handler(SlotError)
    async def _slot(_: Request, exc: SlotError) -> JSONResponse:
        return slot_error(exc).response()

    @app.exception_handler(EngineStopped)
    async def _stopped(_: Request, exc: EngineStopped) -> JSONResponse:
        return APIError(503, f"the server is shutting down: {exc}", headers={"Retry-After": "1"}).response()
