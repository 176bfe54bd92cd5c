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

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from server import errors
from server.errors import APIError
from server.middleware.auth import APIKeyMiddleware
from server.middleware.body_limit import BodyLimitMiddleware
from server.middleware.cors import CORSMiddleware, CORSPolicy, parse_origins
from server.middleware.cross_site import CrossSiteGuard
from server.middleware.header_case import HeaderCase
from server.middleware.path_prefix import PathPrefix
from server.middleware.paths import PublicPaths
from server.router.catalog import catalog
from server.router.child import Child, ClientGone, ModelGone
from server.router.children import DEBUG_DELAY_S, Children
from server.router.forward_path import forward_path
from server.router.metrics import joined, props_of, router_families, scrape
from server.router.upstream import Upstream, UpstreamError

SLEEP_FLAG = "--sleep-idle-seconds"
RETRIES = 2  # a request that met a child being stopped (no byte relayed yet) goes to its model's next child


def create_router_app(settings, shared_args: list[str]) -> FastAPI:
    entries = catalog(settings.models_dir, settings.models_preset)
    children = Children(entries, shared_args, settings.models_max, settings.slot_save_path, settings.drain_timeout)
    upstream = Upstream()  # the proxied requests
    children.on_gone = upstream.forget
    started = int(time.time())

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        yield
        await children.stop_all(settings.drain_timeout)
        await upstream.close()

    app = FastAPI(title="slotserve router", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.children = children
    errors.install(app)

    async def asleep() -> set[str]:
        """The loaded models whose server sleeps (``--sleep-idle-seconds``), from their
        ``/props``, which answers without waking them; asked only where sleep is set."""
        sleepy = [
            c
            for c in children.children.values()
            if c.state == "loaded" and SLEEP_FLAG in (*children.shared_args, *c.entry.args)
        ]
        answers = await asyncio.gather(*(props_of(c) for c in sleepy))
        return {c.entry.name for c, a in zip(sleepy, answers) if a.get("is_sleeping")}

    def listed(child: Child, sleeping: set[str] = frozenset()) -> dict:
        value = {"stopping": "unloading", "reserved": "loaded"}.get(child.state, child.state)
        if value == "loaded" and child.entry.name in sleeping and child.inflight == 0:
            value = "sleeping"
        status: dict = {"value": value}
        if child.error:  # a failed load's error, or how its last server ended
            status["error"] = child.error
        if child.state == "failed":
            status["failed"] = True
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
        if reload:
            raise APIError(405, "reading the catalog again changes state: POST /models/reload")
        children.refresh()
        sleeping = await asleep()
        return {
            "object": "list",
            "data": [listed(c, sleeping) for c in children.children.values() if not c.entry.hidden],
        }

    @app.post("/models/reload")
    async def reload() -> dict:
        """The folder and the preset read again (server/router/children.py, reload); a
        preset that does not parse: 400, nothing changes."""
        try:
            entries = catalog(settings.models_dir, settings.models_preset)
        except ValueError as exc:
            raise APIError(400, str(exc)) from None
        await children.reload(entries)
        return await models()

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
        except ModelGone as exc:
            raise APIError(404, str(exc), "not_found_error") from None
        except ClientGone as exc:  # the client left while queued: nobody reads this
            raise APIError(408, str(exc)) from None

    async def named(request: Request) -> Child:
        """The child a ``{"model": NAME}`` body names (400 for any other body)."""
        try:
            body = json.loads(await request.body())
        except ValueError:
            raise APIError(400, 'the body must be JSON: {"model": NAME}') from None
        return child_of(body.get("model") if isinstance(body, dict) else None)

    @app.post("/models/load")
    async def load(request: Request) -> dict:
        children.release(await acquired(await named(request), request))
        return {"success": True}

    @app.post("/models/unload")
    async def unload(request: Request) -> dict:
        child = await named(request)
        await children.unload(child.entry.name)
        return {"success": True}

    @app.get("/health")
    @app.get("/ready")
    async def health() -> dict:
        """The router is up (200); ``models``: each listed model's state (``loaded``: ready)."""
        children.refresh()
        sleeping = await asleep()
        listing = {n: c for n, c in children.children.items() if not c.entry.hidden}
        return {"status": "ok", "models": {n: listed(c, sleeping)["status"]["value"] for n, c in listing.items()}}

    @app.get("/props")
    async def props(request: Request) -> Response:
        if request.query_params.get("model"):  # a model's own (llama.cpp's web page asks so)
            return await proxy("props", request)
        return JSONResponse(
            {
                "role": "router",
                "max_instances": settings.models_max,
                "models_autoload": settings.models_autoload,
                "build_info": "slotserve",
            }
        )

    @app.get("/metrics")
    async def metrics() -> Response:
        children.refresh()
        live = [c for c in children.children.values() if c.state == "loaded"]
        texts = await asyncio.gather(*(scrape(c) for c in live))
        sleeping = await asleep()
        own = router_families(
            children, {n: listed(c, sleeping)["status"]["value"] for n, c in children.children.items()}
        )
        return PlainTextResponse(own + joined(dict(zip((c.entry.name for c in live), texts))))

    @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
    async def proxy(path: str, request: Request) -> Response:
        target = forward_path("/" + path)  # the decoded path the guards judged
        body = await request.body()
        name = None
        if body:
            try:
                parsed = json.loads(body)
            except ValueError:
                raise APIError(400, "the request body is not JSON") from None
            name = parsed.get("model") if isinstance(parsed, dict) else None
        if name is None:  # GET /slots?model=X, GET /props?model=X (llama-server's router)
            name = request.query_params.get("model")
        if name is None and len(children.children) == 1:  # one model: no need to name it
            name = next(iter(children.children))
        elif name is None and len(alive := [c for c in children.children.values() if c.state == "loaded"]) == 1:
            name = alive[0].entry.name if not body else None  # a GET: the only loaded model
        child = child_of(name)
        if child.state not in ("loaded", "loading") and not settings.models_autoload:
            why = f"model '{name}' is not loaded (POST /models/load first: the router runs --no-models-autoload)"
            raise APIError(400, why)
        query = [(k, v) for k, v in request.query_params.multi_items() if k != "model"]
        for attempt in range(RETRIES + 1):
            child = await acquired(child, request)
            if DEBUG_DELAY_S:  # tests of the queue: the request holds its model a while
                await asyncio.sleep(DEBUG_DELAY_S)
            proc = child.proc
            try:
                response = await upstream.send(child, request.method, target, query, request.headers, body)
            except UpstreamError as exc:
                children.release(child)
                children.refresh()
                if (child.state == "stopping" or child.proc is not proc) and attempt < RETRIES:  # stopped, or died
                    continue
                raise APIError(502, f"model '{name}': its server did not answer ({type(exc).__name__})") from None
            if response.status == 503 and (child.state == "stopping" or child.proc is not proc) and attempt < RETRIES:
                response.close()  # a child being stopped (it drains): ask its next one
                children.release(child)
                continue
            break

        async def relay():
            whole = False
            try:
                async for chunk in response.content.iter_any():
                    yield chunk
                whole = True
            except UpstreamError:  # the child died mid-stream: the client's stream ends here
                children.refresh()
            finally:
                if whole:
                    response.release()  # the connection goes back to the pool
                else:
                    response.close()  # the client left (or the child went): the child sees its stream close
                children.release(child)

        return StreamingResponse(relay(), status_code=response.status, headers=Upstream.headers(response))

    keys = settings.api_keys
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_size)  # the model server's limit, before a load
    app.add_middleware(APIKeyMiddleware, keys=keys, public=PublicPaths(False, settings.metrics_public))
    cors = CORSPolicy(
        parse_origins(settings.cors_origins), settings.cors_methods, settings.cors_headers, settings.cors_credentials
    )
    app.add_middleware(CrossSiteGuard, policy=cors, keys=bool(keys))  # no page on another site loads or unloads
    app.add_middleware(CORSMiddleware, policy=cors)
    app.add_middleware(PathPrefix, prefix=settings.api_prefix)  # the children serve at their root
    app.add_middleware(HeaderCase)  # outermost: header names in their usual spelling, as the model server's
    return app
