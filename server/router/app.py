"""The router's HTTP side (``--models-dir``): llama-server's router routes — ``GET
/models`` and ``/v1/models`` (each model's state), ``POST /models/load`` and
``/models/unload``, ``/props`` (``role: router``) — and every other request proxied to
the child server of the model its body's ``model`` names (none named: the only model
of the catalog; a GET without a body: the only loaded model). A model that is not
loaded is waited for in the load queue (server/router/children.py). Streams pass
through unbuffered; a client that leaves closes the child's stream, which cancels the
request there. ``/metrics`` joins the children's, each sample with a ``model`` label;
``/health`` and ``/ready`` say each model's state. An unknown model: 404 in OpenAI's
shape; a model that cannot load: 503 with its load error; the router itself stays up.
A request that meets a child being stopped before any byte came back is sent again to
its model's next child (the body is held), so unloads in between requests fail none."""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import asynccontextmanager

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response, StreamingResponse
from prometheus_client.parser import text_string_to_metric_families

from server import errors
from server.errors import APIError
from server.middleware.auth import PUBLIC, APIKeyMiddleware
from server.middleware.cors import CORSMiddleware, CORSPolicy, parse_origins
from server.middleware.cross_site import CrossSiteGuard
from server.router.catalog import catalog
from server.router.children import DEBUG_DELAY_S, Child, Children

RETRIES = 2  # a request that met a child being stopped (no byte relayed yet) goes to its model's next child
HOP_HEADERS = {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "te", "upgrade"}


def create_router_app(settings, shared_args: list[str]) -> FastAPI:
    entries = catalog(settings.models_dir, settings.models_preset)
    children = Children(entries, shared_args, settings.models_max, settings.slot_save_path)
    client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10))
    started = int(time.time())

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        yield
        await children.stop_all(settings.drain_timeout)
        await client.aclose()

    app = FastAPI(title="slotserve router", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.children = children
    errors.install(app)

    def listed(child: Child) -> dict:
        status: dict = {"value": "unloading" if child.stopping else child.state}
        if child.error:
            status.update(error=child.error, failed=True)
        if child.proc is not None:  # slotserve's additions, for operators: its server's process, its requests
            status.update(pid=child.proc.pid, in_flight=child.inflight)
        if waiting := next((e.waiters for e in children.queue.entries if e.name == child.entry.name), 0):
            status["queued"] = waiting  # requests waiting for it to load
        return {
            "id": child.entry.name,
            "object": "model",
            "owned_by": "slotserve",
            "created": started,
            "path": str(child.entry.path),
            "status": status,
        }

    @app.get("/models")
    @app.get("/v1/models")
    async def models(reload: int = 0) -> dict:
        if reload:  # the folder and the preset read again (server/router/children.py, reload)
            try:
                entries = catalog(settings.models_dir, settings.models_preset)
            except ValueError as exc:
                raise APIError(400, str(exc)) from None
            await children.reload(entries)
        children.refresh()
        return {"object": "list", "data": [listed(c) for c in children.children.values() if not c.entry.hidden]}

    def child_of(name) -> Child:
        if not isinstance(name, str) or not name:
            raise APIError(400, 'the request must name its model ("model"): this server routes between models')
        if name not in children.children:
            raise APIError(404, f"model '{name}' not found", "not_found_error")
        return children.children[name]

    async def acquired(child: Child, request: Request) -> Child:
        """The child, loaded, with the request counted in flight (children.release it)."""
        try:
            return await children.acquire(child.entry.name, request.is_disconnected)
        except RuntimeError as exc:
            raise APIError(503, str(exc), "unavailable_error") from None
        except LookupError as exc:  # the client left while queued: nobody reads this
            raise APIError(408, str(exc)) from None

    @app.post("/models/load")
    async def load(request: Request) -> dict:
        child = child_of((await request.json()).get("model"))
        children.release(await acquired(child, request))
        return {"success": True}

    @app.post("/models/unload")
    async def unload(request: Request) -> dict:
        child = child_of((await request.json()).get("model"))
        await children.unload(child.entry.name)
        return {"success": True}

    @app.get("/health")
    @app.get("/ready")
    async def health() -> dict:
        """The router is up (200); ``models``: each model's state (``loaded``: ready)."""
        children.refresh()
        return {"status": "ok", "models": {n: listed(c)["status"]["value"] for n, c in children.children.items()}}

    @app.get("/props")
    async def props() -> dict:
        return {
            "role": "router",
            "max_instances": settings.models_max,
            "models_autoload": settings.models_autoload,
            "build_info": "slotserve",
        }

    @app.get("/metrics")
    async def metrics() -> Response:
        children.refresh()
        live = [c for c in children.children.values() if c.state == "loaded"]
        texts = await asyncio.gather(*(_scrape(client, c) for c in live))
        return PlainTextResponse(_joined(dict(zip((c.entry.name for c in live), texts))))

    @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
    async def proxy(path: str, request: Request) -> Response:
        body = await request.body()
        name = None
        if body:
            try:
                parsed = json.loads(body)
            except ValueError:
                raise APIError(400, "the request body is not JSON") from None
            name = parsed.get("model") if isinstance(parsed, dict) else None
        if name is None and len(children.children) == 1:  # one model: no need to name it
            name = next(iter(children.children))
        elif name is None and len(alive := [c for c in children.children.values() if c.state == "loaded"]) == 1:
            name = alive[0].entry.name if not body else None  # a GET: the only loaded model
        child = child_of(name)
        if child.state not in ("loaded", "loading") and not settings.models_autoload:
            why = f"model '{name}' is not loaded (POST /models/load first: the router runs --no-models-autoload)"
            raise APIError(400, why)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        for attempt in range(RETRIES + 1):
            child = await acquired(child, request)
            if DEBUG_DELAY_S:  # tests of the queue: the request holds its model a while
                await asyncio.sleep(DEBUG_DELAY_S)
            proc = child.proc
            upstream = client.build_request(
                request.method, f"{child.url}/{path}", params=request.query_params, headers=headers, content=body
            )
            try:
                response = await client.send(upstream, stream=True)
            except httpx.HTTPError as exc:
                children.release(child)
                children.refresh()
                if (child.stopping or child.proc is not proc) and attempt < RETRIES:  # stopped or died under us
                    continue
                raise APIError(502, f"model '{name}': its server did not answer ({type(exc).__name__})") from None
            if response.status_code == 503 and (child.stopping or child.proc is not proc) and attempt < RETRIES:
                await response.aclose()  # a child being stopped (it drains): ask its next one
                children.release(child)
                continue
            break

        async def relay():
            try:
                async for chunk in response.aiter_raw():
                    yield chunk
            except httpx.HTTPError:  # the child died mid-stream: the client's stream ends here
                children.refresh()
            finally:
                await response.aclose()  # also when the client left: the child sees the stream close
                children.release(child)

        out_headers = {k: v for k, v in response.headers.items() if k.lower() not in HOP_HEADERS}
        return StreamingResponse(relay(), status_code=response.status_code, headers=out_headers)

    keys = settings.api_keys
    app.add_middleware(APIKeyMiddleware, keys=keys, public=PUBLIC | {"/metrics"} if settings.metrics_public else PUBLIC)
    cors = CORSPolicy(
        parse_origins(settings.cors_origins), settings.cors_methods, settings.cors_headers, settings.cors_credentials
    )
    app.add_middleware(CrossSiteGuard, policy=cors)  # a page on another site cannot load, unload or ask
    app.add_middleware(CORSMiddleware, policy=cors)
    return app


async def _scrape(client: httpx.AsyncClient, child: Child) -> str:
    try:
        return (await client.get(child.url + "/metrics", timeout=10)).text
    except httpx.HTTPError:
        return ""


def _joined(texts: dict[str, str]) -> str:
    """The children's Prometheus texts as one, each sample labelled with its ``model``."""
    families: dict[str, tuple[str, str, list[str]]] = {}  # name -> (type, help, sample lines)
    for model, text in texts.items():
        for family in text_string_to_metric_families(text):
            kind, doc, lines = families.setdefault(family.name, (family.type, family.documentation, []))
            for s in family.samples:
                labels = {"model": model, **s.labels}
                rendered = ",".join(f'{k}="{_escaped(v)}"' for k, v in labels.items())
                lines.append(f"{s.name}{{{rendered}}} {s.value}")
    out = []
    for name, (kind, doc, lines) in families.items():
        out += [f"# HELP {name} {doc}", f"# TYPE {name} {kind}", *lines]
    return "\n".join(out) + "\n"


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
