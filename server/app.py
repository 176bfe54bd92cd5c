"""The FastAPI application: state, routes, errors, auth, health and readiness."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from server import errors, native_api, openai_api, slot_api
from server.auth import PUBLIC, APIKeyMiddleware, JSONBodyMiddleware
from server.body_limit import BodyLimitMiddleware
from server.metrics import StatusCounter
from server.settings import ServerSettings
from server.state import ServerState


def create_app(settings: ServerSettings) -> FastAPI:
    state = ServerState(settings)

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        state.start_loading(asyncio.get_running_loop())  # returns at once: the listener answers while the model loads
        yield
        state.close()

    app = FastAPI(title="slotserve", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.slotserve = state
    errors.install(app)
    app.include_router(openai_api.router)
    app.include_router(native_api.router)
    app.include_router(slot_api.router)

    @app.get("/health")
    async def health() -> JSONResponse:
        code, body = state.health()
        return JSONResponse(body, status_code=code)

    @app.get("/ready")
    async def ready() -> JSONResponse:
        code, body = state.ready()
        return JSONResponse(body, status_code=code)

    if settings.metrics:

        @app.get("/metrics")
        async def metrics() -> Response:
            return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    public = PUBLIC | {"/metrics"} if settings.metrics_public else PUBLIC
    app.add_middleware(JSONBodyMiddleware)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_size)
    app.add_middleware(APIKeyMiddleware, keys=settings.api_keys, public=public)
    app.add_middleware(StatusCounter, metrics=state.metrics)  # outermost: sees 401s too
    return app
