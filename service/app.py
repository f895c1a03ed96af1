"""The HTTP face of versiq: IQv2 versioned queries over HTTP (docs/contract.md), and the
records of streams: the app and its middleware.

Routes are thin: all query logic lives in ``versiq.query``. Everything under ``/v1`` is routed
on the raw path (``service.routes``) by ``VersiqMiddleware``, which also does metrics, bearer-token
auth (``service.auth``) and problem+json errors (``service.errors``), then hands the route to its
handler (``service.handlers``); FastAPI serves the operational endpoints (``/healthz``,
``/readyz``, ``/metrics``, ``/openapi.json``), the console (``service.console_pages``) and the API docs
(``/docs``, ``/redoc``: ``service.docs_pages``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from versiq.service.auth import authorized
from versiq.service.bodies import media_type_of, parse_json_off_loop, require_json
from versiq.service.console_pages import CONSOLE_ROUTES, add_console_routes
from versiq.service.docs_pages import DOCS_ROUTES, add_docs_routes
from versiq.service.errors import internal_error, method_not_allowed, problem_response, send_problem
from versiq.service.errors import send as send_response
from versiq.service.etags import etag_of, not_modified
from versiq.service.handlers import MAX_BATCH_OBJECTS, NDJSON, Service, negotiate
from versiq.service.problems import Problem, bad_request
from versiq.service.render import JSON, dumps
from versiq.service.routes import POST_ROUTES, ROUTE_CHANGES, ROUTE_LOOKUPS, match_v1, split_path
from versiq.service.settings import Settings

if TYPE_CHECKING:
    from versiq.query.engine import Engine

log = logging.getLogger("versiq.service")

OPENAPI_PATH = Path(__file__).with_name("openapi.yaml")

_OPS_ROUTES = frozenset({"/healthz", "/readyz", "/metrics", "/openapi.json"})


@lru_cache(maxsize=1)
def openapi_document() -> dict[str, Any]:
    """The committed contract (``service/openapi.yaml``, equal to the repo's ``openapi.yaml``)."""
    with OPENAPI_PATH.open(encoding="utf-8") as fh:
        doc: dict[str, Any] = yaml.safe_load(fh)
    return doc


def _server_timing(start: float) -> tuple[bytes, bytes]:
    """``Server-Timing: app;dur=<ms>``: the time the server took up to the response's first
    byte (the whole answer except a streamed body), so clients and benchmarks can tell it from
    the network's (W3C Server Timing)."""
    return b"server-timing", f"app;dur={(time.perf_counter() - start) * 1000:.3f}".encode()


class VersiqMiddleware:
    """Metrics for every request, auth, and raw-path routing of ``/v1/...``."""

    def __init__(self, app: ASGIApp, service: Service) -> None:
        self.app = app
        self.service = service

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status_box = [500]
        method = scope.get("method", "")
        if method == "HEAD":  # GET's status and headers (Content-Length included), no body
            scope = dict(scope, method="GET")

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                status_box[0] = message["status"]
                message = dict(message, headers=[*message.get("headers", []), _server_timing(start)])
            elif method == "HEAD" and message["type"] == "http.response.body":
                message = {"type": "http.response.body", "body": b"", "more_body": message.get("more_body", False)}
            await send(message)

        raw_path: bytes = scope.get("raw_path") or scope["path"].encode("utf-8")
        raw_path = raw_path.split(b"?", 1)[0]
        template = "unmatched"
        try:
            if raw_path == b"/v1" or raw_path.startswith(b"/v1/"):
                template = await self._v1(scope, receive, raw_path, send_wrapper)
            else:
                path = scope.get("path", "")
                if path in _OPS_ROUTES or path in CONSOLE_ROUTES or path in DOCS_ROUTES:
                    template = path
                if path == "/metrics":
                    problem = authorized(self.service.settings.api_tokens, scope)
                    if problem is not None:
                        await send_problem(send_wrapper, problem)
                        return
                await self.app(scope, receive, send_wrapper)
        finally:
            self.service.metrics.observe(method, template, status_box[0],
                                         time.perf_counter() - start)

    async def _v1(self, scope: Scope, receive: Receive, raw_path: bytes, send: Send) -> str:
        template = "unmatched"
        try:
            problem = authorized(self.service.settings.api_tokens, scope)
            if problem is not None:
                raise problem
            route = match_v1(split_path(raw_path))
            if route is None:
                raise Problem("route-not-found", f"no resource at {raw_path.decode('latin-1')!r}")
            template = route.template
            query_string = scope.get("query_string", b"")
            if route.template in POST_ROUTES:
                if scope["method"] != "POST":
                    raise method_not_allowed(scope["method"], "POST")
                if route.template == ROUTE_LOOKUPS:
                    async with self.service.bodies.read(scope, receive) as raw:
                        media, chunks = await self.service.lookups(route, query_string, media_type_of(scope),
                                                                   raw, _header(scope, b"accept"))
                    await _send_chunks(send, media, chunks)
                    return template
                require_json(scope)
                async with self.service.bodies.read(scope, receive) as raw:
                    request = await parse_json_off_loop(raw, MAX_BATCH_OBJECTS)
                body = await self.service.handle_post(route, query_string, request)
            else:
                if scope["method"] != "GET":
                    raise method_not_allowed(scope["method"])
                if route.template == ROUTE_CHANGES and _wants(scope, NDJSON):
                    headers, stream = await self.service.changes_stream(route, query_string)
                    await _send_stream(send, NDJSON, headers, stream)
                    return template
                body = await self.service.handle_v1(route, query_string)
                etag = etag_of(body)
                if not_modified(_header(scope, b"if-none-match"), etag):
                    await send({"type": "http.response.start", "status": 304, "headers": [(b"etag", etag.encode())]})
                    await send({"type": "http.response.body", "body": b""})
                    return template
                await send_response(send, 200, body, JSON, {"etag": etag})
                return template
            await send_response(send, 200, body, JSON)
        except Problem as problem:
            await send_problem(send, problem)
        except Exception:
            log.exception("internal error serving %s", raw_path.decode("latin-1"))
            await send_problem(send, internal_error())
        return template


async def _send_chunks(send: Send, media_type: str, chunks: list[bytes]) -> None:
    """A 200 sent as ``chunks`` (HTTP/1.1 chunked: NDJSON lines reach the client as they go)."""
    headers = [(b"content-type", media_type.encode("latin-1"))]
    if len(chunks) == 1:
        headers.append((b"content-length", str(len(chunks[0])).encode("ascii")))
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    for i, chunk in enumerate(chunks):
        await send({"type": "http.response.body", "body": chunk, "more_body": i + 1 < len(chunks)})
    if not chunks:
        await send({"type": "http.response.body", "body": b""})


def _wants(scope: Scope, media_type: str) -> bool:
    """Whether the request's ``Accept`` chooses ``media_type`` (``handlers.negotiate``)."""
    try:
        return negotiate(_header(scope, b"accept")) == media_type
    except Problem:
        return False


async def _send_stream(send: Send, media_type: str, headers: dict[str, str], chunks: AsyncIterator[bytes]) -> None:
    """A 200 whose body is sent chunk by chunk as ``chunks`` produces it (HTTP/1.1 chunked)."""
    raw = [(b"content-type", media_type.encode("latin-1"))]
    raw += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": 200, "headers": raw})
    async for chunk in chunks:
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


def _header(scope: Scope, name: bytes) -> str | None:
    """The value of request header ``name`` (lower case), the values of repeats joined."""
    values = [v.decode("latin-1") for k, v in scope.get("headers", []) if k == name]
    return ", ".join(values) if values else None


def create_app(engine_or_settings: Engine | Settings, *, settings: Settings | None = None) -> FastAPI:
    """Build the app around a started ``Engine`` (the caller owns it) or from ``Settings``
    (the app starts the engine on startup and closes it on shutdown)."""
    if isinstance(engine_or_settings, Settings):
        settings = engine_or_settings
        engine: Engine | None = None
        owns_engine = True
    else:
        engine = engine_or_settings
        settings = settings or Settings(warehouse=str(getattr(engine, "warehouse", "")))
        owns_engine = False
    service = Service(settings, engine)
    openapi_bytes = dumps(openapi_document())

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if owns_engine:
            from versiq.query.engine import Engine as EngineImpl  # the app may be built before an engine exists

            started = EngineImpl(settings.warehouse, refresh_interval_s=settings.refresh_interval_s,
                                 watch_interval_s=settings.watch_interval_s)
            await run_in_threadpool(started.start)
            service.engine = started
        try:
            yield
        finally:
            if owns_engine and service.engine is not None:
                await run_in_threadpool(service.engine.close)
                service.engine = None

    app = FastAPI(title="versiq", docs_url=None, redoc_url=None, openapi_url=None,
                  lifespan=lifespan)
    app.state.service = service

    @app.get("/healthz")
    async def healthz() -> Response:
        return JSONResponse({"status": "ok"})

    @app.get("/readyz")
    async def readyz(request: Request) -> Response:
        state = await run_in_threadpool(service.readiness)
        if authorized(settings.api_tokens, request.scope) is not None:
            # With auth on, an anonymous probe learns only whether the server is ready: store
            # names, snapshots, errors and paths are for token holders.
            state = {"ready": bool(state.get("ready"))}
            if state["ready"]:
                return JSONResponse(state)
            return problem_response(Problem("not-ready", "not ready (details need a bearer token)", **state))
        if state.get("ready"):
            return JSONResponse(state)
        return problem_response(Problem("not-ready", _not_ready_detail(state, service.engine is None), **state))

    @app.get("/metrics")
    async def metrics() -> Response:
        body = await run_in_threadpool(generate_latest, service.metrics.registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @app.get("/openapi.json")
    async def openapi() -> Response:
        return Response(openapi_bytes, media_type=JSON)

    add_console_routes(app)
    add_docs_routes(app)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 404:
            problem = Problem("route-not-found", f"no resource at {request.url.path!r}")
        elif exc.status_code == 405:
            problem = method_not_allowed(request.method)
        else:
            problem = Problem("bad-request", str(exc.detail))
            problem.status = exc.status_code
        return problem_response(problem)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        return problem_response(bad_request(f"invalid request: {exc.errors()}"))

    @app.exception_handler(Exception)
    async def internal_error_handler(request: Request, exc: Exception) -> Response:
        log.error("internal error serving %s", request.url.path, exc_info=exc)
        return problem_response(internal_error())

    app.add_middleware(VersiqMiddleware, service=service)
    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(settings.cors_origins),
                           allow_methods=["GET", "POST"], allow_headers=["Authorization", "Content-Type"])
    return app


def _not_ready_detail(state: dict[str, Any], no_engine: bool) -> str:
    if no_engine:
        return "the query engine is not started"
    reasons = [f"store {name!r}: {info['error']}" for name, info in state.get("stores", {}).items()
               if info.get("error")]
    reasons += [f"stream {name!r}: {info['error']}" for name, info in state.get("streams", {}).items()
                if info.get("error")]
    reasons += [f"store {name!r} refused: {why}" for name, why in state.get("refused", {}).items()]
    reasons += [f"{name!r} cannot be read: {why}" for name, why in state.get("unavailable", {}).items()
                if why not in {info.get("error") for info in [*state.get("stores", {}).values(),
                                                              *state.get("streams", {}).values()]}]
    return "not ready" + (": " + "; ".join(reasons) if reasons else ": stores not loaded yet")


def app_from_env() -> FastAPI:
    """Factory for ``uvicorn service.app:app_from_env --factory`` (used by ``versiq serve``)."""
    return create_app(Settings.from_env())
