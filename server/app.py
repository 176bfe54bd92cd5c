"""The FastAPI application: state, routes, errors, auth, health and readiness."""

from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from server import engine_errors, errors
from server.config.settings import ServerSettings
from server.errors import APIError
from server.middleware.auth import APIKeyMiddleware
from server.middleware.body_limit import BodyLimitMiddleware
from server.middleware.cors import CORSMiddleware, CORSPolicy, parse_origins
from server.middleware.cross_site import CrossSiteGuard
from server.middleware.header_case import HeaderCase
from server.middleware.idle_sleep import IdleSleep, WakeOnRequest
from server.middleware.json_body import JSONBodyMiddleware
from server.middleware.path_prefix import PathPrefix
from server.middleware.paths import PublicPaths
from server.routes import (
    anthropic_api,
    cors_proxy,
    embeddings_api,
    infill_api,
    lora_api,
    native_api,
    openai_api,
    rerank_api,
    responses_api,
    slot_api,
    webui,
)
from server.schemas.answers import ErrorBody, Status, documented
from server.schemas.openapi import build_openapi
from server.state import ServerState
from server.telemetry.metrics import StatusCounter


def create_app(settings: ServerSettings) -> FastAPI:
    """The app: the routers, the probes, /metrics and /openapi.json, then the middleware
    (outermost last). The model loads in the background once the app starts."""
    state = ServerState(settings)

    sleep = IdleSleep(state, settings.sleep_idle_seconds) if settings.sleep_idle_seconds > 0 else None

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        state.start_loading(asyncio.get_running_loop())  # returns at once: the listener answers while the model loads
        watch = asyncio.create_task(sleep.watch()) if sleep is not None else None
        yield
        if watch is not None:
            watch.cancel()
        state.close()

    app = FastAPI(title="slotserve", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.slotserve = state
    errors.install(app)
    engine_errors.install(app)
    app.include_router(openai_api.router)
    app.include_router(native_api.router)
    app.include_router(infill_api.router)
    app.include_router(anthropic_api.router)
    app.include_router(responses_api.router)
    app.include_router(embeddings_api.router)
    app.include_router(rerank_api.router)
    app.include_router(lora_api.router)
    app.include_router(slot_api.router)
    app.include_router(cors_proxy.router)
    public = PublicPaths(settings.webui, settings.metrics_public)
    if settings.webui:
        webui.mount(app)
    _add_probes(app, state)
    _add_metrics(app, state)
    _add_openapi(app, state, public, sleep)
    if sleep is not None:  # innermost: after the key check and the path prefix, a request waits for the wake
        app.add_middleware(WakeOnRequest, sleep=sleep, routes=app.router.routes)
    _add_middleware(app, state, public)
    return app


def _add_probes(app: FastAPI, state: ServerState) -> None:
    why = "not alive / not ready (the body says why; /health while loading: llama-server's error)"
    probe = documented(Status) | {503: {"model": Status | ErrorBody, "description": why}}

    @app.get("/health", response_model=None, responses=probe)
    async def health() -> JSONResponse:
        code, body = state.health()
        return JSONResponse(body, status_code=code)

    @app.get("/ready", response_model=None, responses=probe)
    async def ready() -> JSONResponse:
        code, body = state.ready()
        return JSONResponse(body, status_code=code)


def _add_metrics(app: FastAPI, state: ServerState) -> None:
    started = str(int(time.time()))

    @app.get("/metrics", response_class=PlainTextResponse, responses=documented(None, 501, text=True))
    async def metrics() -> Response:
        """Prometheus text: slotserve's families, then llama-server's (``llamacpp:*``,
        once the model is loaded); ``Process-Start-Time-Unix`` says when this process
        started (as llama-server's). 501 with ``--no-metrics``."""
        if not state.settings.metrics:
            raise APIError(501, "this server does not serve metrics: start it with --metrics", "not_supported_error")
        body = generate_latest(state.metrics.registry)
        engine = state.metrics_source()
        if engine is not None:
            body += state.metrics.llamacpp.render(engine.health(), engine.cache_stats()).encode()
        return Response(body, media_type=CONTENT_TYPE_LATEST, headers={"Process-Start-Time-Unix": started})


def _add_openapi(app: FastAPI, state: ServerState, public: PublicPaths, sleep: IdleSleep | None) -> None:
    document: dict = {}

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi() -> JSONResponse:
        """The document, with the limits of the loaded model (503 while it loads; a
        sleeping model is woken the first time only: the document is kept); /v1/rerank
        only where a reranker is loaded."""
        if not document:
            if sleep is not None and state.sleeping:
                await sleep.wake()
            engine = state.require_model()
            limits = {"vocab": engine.vocab_size, "n_slots": state.settings.parallel, "n_embd": engine.hidden_size}
            limits["n_lora"], limits["max_inputs"] = len(state.lora_scales), state.settings.max_inputs
            document.update(build_openapi(app, limits, bool(state.settings.api_keys), public.exact()))
            if state.embedding_pooling != "rank" or not state.serves_embeddings:  # only a reranker documents it
                document["paths"].pop("/v1/rerank", None)
            else:  # and not the embeddings it refuses
                for path in [p for p in document["paths"] if p.endswith(("/embedding", "/embeddings"))]:
                    document["paths"].pop(path)
        return JSONResponse(document)


def _add_middleware(app: FastAPI, state: ServerState, public: PublicPaths) -> None:
    """Added innermost first: JSON bodies, the body limit, API keys, the cross-site
    refusal, CORS, the status counter, the path prefix, the header spelling."""
    settings = state.settings
    app.add_middleware(JSONBodyMiddleware)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_size)
    app.add_middleware(APIKeyMiddleware, keys=settings.api_keys, public=public)
    cors = CORSPolicy(
        parse_origins(settings.cors_origins), settings.cors_methods, settings.cors_headers, settings.cors_credentials
    )
    # before the key: a page's simple POST needs none to be refused
    app.add_middleware(CrossSiteGuard, policy=cors, keys=bool(settings.api_keys))
    app.add_middleware(CORSMiddleware, policy=cors)  # outside the key check: preflights carry no credentials
    app.add_middleware(StatusCounter, metrics=state.metrics)  # sees 401s too
    app.add_middleware(PathPrefix, prefix=settings.api_prefix)  # routes see paths without it
    app.add_middleware(HeaderCase)  # outermost: every answer's header names in their usual spelling
