"""Every error leaves the server in the OpenAI shape: {"error": {"message", "type", "code"}}.

The shapes and the handlers every app installs (the router's too, which imports no
engine); the engine's own errors are mapped in server/engine_errors.py."""

from __future__ import annotations

import logging
import traceback

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("slotserve")

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    507: "server_error",
    501: "not_supported_error",
    503: "unavailable_error",
}


class APIError(Exception):
    def __init__(self, status: int, message: str, type_: str | None = None, code=None, headers=None, **extra):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_ or _TYPES.get(status, "server_error")
        self.code = code if code is not None else status
        self.headers = headers
        self.extra = extra

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "code": self.code, **self.extra}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


_TAGS = {"body", "str", "int", "float", "bool", "none", "list", "dict"}


def _field(loc: tuple) -> str:
    """``prompt.0``, not ``body.prompt.list[function-before[...]].0``: union member tags
    (never valid field names: they hold '[' or '-') are left out."""
    parts = [str(p) for p in loc if p not in _TAGS and not any(c in str(p) for c in "[-")]
    return ".".join(parts) or "body"


def _validation_message(exc: RequestValidationError) -> str:
    errors = exc.errors()
    if not errors:
        return "invalid request"
    first = errors[0]
    if first.get("type") == "json_invalid":
        return f"malformed JSON: {first.get('ctx', {}).get('error', first.get('msg'))}"
    msg = first.get("msg", "invalid value")
    return f"{_field(tuple(first.get('loc', ())))}: {msg}"


_FIELD_CODES = {"action": "invalid_action", "id_slot": "invalid_id_slot", "filename": "invalid_filename"}


def _validation_code(exc: RequestValidationError) -> str | int:
    """A named code for the fields clients branch on (llama-server's slot calls), else 400."""
    errors = exc.errors()
    loc = errors[0].get("loc", ()) if errors else ()
    return next((_FIELD_CODES[p] for p in loc if isinstance(p, str) and p in _FIELD_CODES), 400)


ANTHROPIC_PATHS = ("/v1/messages",)


def shaped(path: str, error: APIError) -> JSONResponse:
    """The error in the route's family's shape: Anthropic's on its routes
    (``{"type": "error", "error": {"type", "message"}}``), OpenAI's elsewhere."""
    if path.startswith(ANTHROPIC_PATHS):
        body = {"type": "error", "error": {"type": error.type, "message": error.message}}
        return JSONResponse(body, status_code=error.status, headers=error.headers)
    return error.response()


def answer(request: Request, error: APIError) -> JSONResponse:
    return shaped(request.url.path, error)


def install(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return answer(request, exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return answer(request, APIError(400, _validation_message(exc), code=_validation_code(exc)))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = "not found" if exc.status_code == 404 else str(exc.detail)
        return answer(request, APIError(exc.status_code, message, headers=exc.headers))  # 405 keeps its Allow

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        # where it failed, not what it said: a message may quote client text
        frames = "".join(traceback.format_tb(exc.__traceback__))
        log.error("internal error on %s %s: %s\n%s", request.method, request.url.path, type(exc).__name__, frames)
        return answer(request, APIError(500, f"internal error: {type(exc).__name__}"))
