"""The HTTP face of versiq: IQv2 versioned queries over HTTP (issue 4, CONTRACT.md), and the
records of streams (issue 5).

Routes are thin: all query logic lives in ``query.engine``. Everything under ``/v1`` is routed
on the raw path (see ``service.params``) by ``VersiqMiddleware``, which also does metrics,
bearer-token auth and problem+json errors; FastAPI serves the operational endpoints
(``/healthz``, ``/readyz``, ``/metrics``, ``/openapi.json``).
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
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

from versiq.names import is_valid_store_name
from versiq.query.api import (
    InvalidQuery,
    MultiVersionedKeyQuery,
    SnapshotGone,
    SnapshotNotFound,
    StoreInfo,
    StoreNotFound,
    StoreUnavailable,
    StreamNotFound,
    StreamUnavailable,
    UnsupportedQuery,
    VersionedKeyQuery,
)
from versiq.query.streams import StreamInfo, StreamPosition, StreamRecordsQuery
from versiq.service.metrics import Metrics
from versiq.service.params import (
    ROUTE_KEY,
    ROUTE_STORE,
    ROUTE_STORES,
    ROUTE_STREAM,
    ROUTE_STREAM_RECORDS,
    ROUTE_STREAMS,
    ROUTE_VERSIONS,
    Route,
    match_v1,
    order_param,
    page_size_param,
    parse_query,
    snapshot_param,
    split_path,
    timestamp_param,
)
from versiq.service.problems import PROBLEM_MEDIA_TYPE, Problem, bad_request
from versiq.service.settings import Settings
from versiq.service.tokens import STREAM_RECORDS, PageQuery, PageTokens

if TYPE_CHECKING:
    from versiq.query.engine import Engine

log = logging.getLogger("versiq.service")

OPENAPI_PATH = Path(__file__).with_name("openapi.yaml")
JSON = "application/json"
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_OPS_ROUTES = frozenset({"/healthz", "/readyz", "/metrics", "/openapi.json"})
_OPEN_ROUTES = frozenset({"/healthz", "/readyz", "/openapi.json"})


@lru_cache(maxsize=1)
def openapi_document() -> dict[str, Any]:
    """The committed contract (``service/openapi.yaml``, equal to the repo's ``openapi.yaml``)."""
    with OPENAPI_PATH.open(encoding="utf-8") as fh:
        doc: dict[str, Any] = yaml.safe_load(fh)
    return doc


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _range_params(params: dict[str, str]) -> tuple[int | None, int | None, str, int]:
    """``from``, ``to`` (checked in order), ``order`` and ``pageSize`` of a listing."""
    from_time = timestamp_param(params, "from")
    to_time = timestamp_param(params, "to")
    if from_time is not None and to_time is not None and from_time > to_time:
        raise bad_request(f"'from' ({from_time}) is after 'to' ({to_time})", parameter="from")
    return from_time, to_time, order_param(params), page_size_param(params)


def _int_or_null(value: int | None) -> bytes:
    return b"null" if value is None else str(int(value)).encode("ascii")


def store_info_json(info: StoreInfo) -> dict[str, Any]:
    versioned = info.kind == "versioned"
    per_partition = []
    for partition in sorted(info.stream_time):
        st = info.stream_time[partition]
        per_partition.append({
            "partition": partition,
            "streamTime": st,
            "oldestQueryableTimestamp": max(0, st - info.history_retention_ms) if versioned else None,
        })
    stream_time = max(info.stream_time.values()) if info.stream_time else None
    oldest = None
    if versioned and stream_time is not None:
        oldest = max(0, stream_time - info.history_retention_ms)
    return {
        "name": info.name,
        "kind": info.kind,
        "historyRetentionMs": info.history_retention_ms,
        "partitions": info.partitions,
        "streamTime": stream_time,
        "partitionStreamTimes": per_partition,
        "snapshot": info.snapshot,
        "oldestQueryableTimestamp": oldest,
        "counts": dict(info.counts),
        "inputs": dict(info.inputs),
        "sources": {name: {"run": v["run"], "snapshot": v["snapshot"]} for name, v in info.sources.items()},
    }


def stream_info_json(info: StreamInfo) -> dict[str, Any]:
    return {
        "name": info.name,
        "snapshot": info.snapshot,
        "lastRun": info.last_run,
        "buckets": info.buckets,
        "counts": dict(info.counts),
        "minTimestamp": info.min_timestamp,
        "maxTimestamp": info.max_timestamp,
        "inputs": dict(info.inputs),
        "sources": {name: {"run": v["run"], "snapshot": v["snapshot"]} for name, v in info.sources.items()},
    }


_NAME_RULE = "1-100 letters, digits, '_', '-' or '.', starting with a letter or digit"


class Service:
    """Per-app state: the engine, page tokens, auth and metrics."""

    def __init__(self, settings: Settings, engine: Engine | None) -> None:
        self.settings = settings
        self.engine = engine
        self.tokens = PageTokens(settings.token_secret, settings.token_ttl_s)
        self.metrics = Metrics(self.readiness)

    def readiness(self) -> dict[str, Any]:
        if self.engine is None:
            return {"ready": False, "stores": {}, "streams": {}, "refused": {}, "unavailable": {}}
        return self.engine.readiness()

    def require_engine(self) -> Engine:
        if self.engine is None:
            raise Problem("not-ready", "the query engine is not started")
        return self.engine

    def authorized(self, scope: Scope) -> Problem | None:
        tokens = self.settings.api_tokens
        if tokens is None:
            return None
        header = b""
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                header = value
                break
        scheme, _, presented = header.partition(b" ")
        if not header:
            return Problem("unauthorized", "this server requires a bearer token: send "
                           "'Authorization: Bearer <token>'",
                           headers={"www-authenticate": 'Bearer realm="versiq"'})
        ok = False
        if scheme.lower() == b"bearer":
            candidate = presented.strip()
            for token in tokens:
                if hmac.compare_digest(candidate, token.encode("utf-8")):
                    ok = True
        if ok:
            return None
        return Problem("unauthorized", "the bearer token is not valid for this server",
                       headers={"www-authenticate": 'Bearer realm="versiq", error="invalid_token"'})

    # ------------------------------------------------------------------ /v1 handlers
    async def handle_v1(self, route: Route, query_string: bytes) -> bytes:
        if route.template == ROUTE_STORES:
            parse_query(query_string, ())
            engine = self.require_engine()
            stores = await run_in_threadpool(engine.list_stores)
            unavailable = await run_in_threadpool(engine.unavailable)
            return _dumps({"stores": [store_info_json(s) for s in stores],
                           "unavailable": [{"name": name, "error": error} for name, error in unavailable.items()]})
        if route.template in (ROUTE_STREAMS, ROUTE_STREAM, ROUTE_STREAM_RECORDS):
            return await self._streams(route, query_string)
        store = route.store or ""
        if not is_valid_store_name(store):
            raise Problem("store-not-found", f"no store named {store!r}: store names are {_NAME_RULE}",
                          store=store)
        if route.template == ROUTE_STORE:
            params = parse_query(query_string, ("snapshot",))
            snapshot = snapshot_param(params)
            engine = self.require_engine()
            info = await self._call(store, snapshot, engine.store_info, store, snapshot)
            return _dumps(store_info_json(info))
        key = route.key or ""
        if route.template == ROUTE_KEY:
            return await self._get(store, key, query_string)
        assert route.template == ROUTE_VERSIONS
        return await self._versions(store, key, query_string)

    async def _call(self, store: str, at: int | None, fn: Callable[..., Any], *args: Any,
                    what: str = "store", **kwargs: Any) -> Any:
        """Run an engine call in the thread pool, mapping its errors to problems; ``what`` is
        ``store`` or ``stream`` (the kind of ``store``, also the problems' extension member)."""
        snapshot = at
        name: dict[str, Any] = {what: store}
        try:
            return await run_in_threadpool(fn, *args, **kwargs)
        except StoreNotFound as exc:
            raise Problem("store-not-found", str(exc) or f"no store named {store!r} in the warehouse",
                          store=store) from None
        except StreamNotFound as exc:
            raise Problem("stream-not-found", str(exc) or f"no stream named {store!r} in the warehouse",
                          stream=store) from None
        except (StoreUnavailable, StreamUnavailable) as exc:
            # the engine retries at every refresh: worth asking again after one interval
            retry = {"retry-after": str(max(1, round(self.settings.refresh_interval_s)))}
            raise Problem(f"{what}-unavailable", str(exc), headers=retry, **name) from None
        except SnapshotNotFound as exc:
            raise Problem("snapshot-not-found", str(exc) or f"{what} {store!r} has no snapshot {snapshot}",
                          **name, snapshot=snapshot) from None
        except SnapshotGone as exc:
            raise Problem("gone", str(exc) or f"snapshot {snapshot} of {what} {store!r} is no longer "
                          "readable (vacuumed)", **name, snapshot=snapshot) from None
        except InvalidQuery as exc:
            raise bad_request(str(exc) or "invalid query") from None
        except UnsupportedQuery as exc:
            raise Problem("unsupported-query", str(exc) or "the query does not apply to this store",
                          store=store) from None

    # ------------------------------------------------------------------ streams
    async def _streams(self, route: Route, query_string: bytes) -> bytes:
        if route.template == ROUTE_STREAMS:
            parse_query(query_string, ())
            engine = self.require_engine()
            streams = await run_in_threadpool(engine.list_streams)
            return _dumps({"streams": [stream_info_json(s) for s in streams]})
        stream = route.stream or ""
        if not is_valid_store_name(stream):
            raise Problem("stream-not-found", f"no stream named {stream!r}: stream names are {_NAME_RULE}",
                          stream=stream)
        if route.template == ROUTE_STREAM:
            params = parse_query(query_string, ("snapshot",))
            snapshot = snapshot_param(params)
            engine = self.require_engine()
            info = await self._call(stream, snapshot, engine.stream_info, stream, snapshot, what="stream")
            return _dumps(stream_info_json(info))
        assert route.template == ROUTE_STREAM_RECORDS
        return await self._stream_records(stream, query_string)

    async def _stream_records(self, stream: str, query_string: bytes) -> bytes:
        params = parse_query(query_string,
                             ("key", "from", "to", "order", "pageSize", "pageToken", "snapshot"))
        key = params.get("key")
        if key == "":
            raise bad_request("query parameter 'key' must not be empty (omit it for every key)",
                              parameter="key")
        from_time, to_time, order, page_size = _range_params(params)
        bound = PageQuery(stream, key, from_time, to_time, order, STREAM_RECORDS)
        snapshot, position = self._resume(params, bound)
        resume_after: StreamPosition | None = None
        if position is not None:
            if len(position.position) != 2:
                raise bad_request("query parameter 'pageToken' is not a valid page token",
                                  parameter="pageToken")
            resume_after = StreamPosition(*position.position)
        engine = self.require_engine()
        page = await self._call(
            stream, snapshot, engine.stream_records, stream,
            StreamRecordsQuery(key, from_time, to_time, order == "asc"),
            what="stream", snapshot=snapshot, resume_after=resume_after, limit=page_size,
        )
        next_token = None
        if page.resume_after is not None:
            after = page.resume_after
            next_token = self.tokens.issue(bound, page.snapshot, (after.run, after.sequence))
        records = b",".join(
            b"".join((b'{"key":', _dumps(r.key), b',"value":',
                      b"null" if r.value is None else r.value.encode("utf-8"),
                      b',"timestamp":', _int_or_null(r.timestamp), b',"run":', _int_or_null(r.run),
                      b',"sequence":', _int_or_null(r.sequence), b"}"))
            for r in page.records
        )
        return b"".join((
            b'{"stream":', _dumps(stream), b',"key":', _dumps(key), b',"records":[', records,
            b'],"nextPageToken":', _dumps(next_token), b',"snapshot":', _int_or_null(page.snapshot), b"}",
        ))

    async def _get(self, store: str, key: str, query_string: bytes) -> bytes:
        params = parse_query(query_string, ("asOf", "snapshot"))
        if not key:
            raise bad_request("the key must not be empty")
        as_of = timestamp_param(params, "asOf")
        snapshot = snapshot_param(params)
        engine = self.require_engine()
        result = await self._call(store, snapshot, engine.get, store,
                                  VersionedKeyQuery(key, as_of), snapshot=snapshot)
        if result.outcome == "ok" and result.record is not None:
            rec = result.record
            return b"".join((
                b'{"key":', _dumps(key), b',"value":', rec.value.encode("utf-8"),
                b',"timestamp":', _int_or_null(rec.timestamp),
                b',"validTo":', _int_or_null(rec.valid_to),
                b',"snapshot":', _int_or_null(result.snapshot), b"}",
            ))
        when = "now (latest)" if as_of is None else f"as of {as_of}"
        extra = {"key": key, "snapshot": result.snapshot, "horizon": result.horizon}
        if result.outcome == "expired":
            raise Problem(
                "expired",
                f"asOf {as_of} is older than the history-retention horizon {result.horizon} "
                f"(stream time - historyRetentionMs of the key's partition) of store {store!r} at "
                f"snapshot {result.snapshot}; the latest version of key {key!r} is newer than "
                "that, so no answer can be given",
                **extra,
            )
        raise Problem("not-found", f"key {key!r} has no value {when} in store {store!r} at "
                      f"snapshot {result.snapshot}", **extra)

    def _resume(self, params: dict[str, str], bound: PageQuery) -> tuple[int | None, Any]:
        """The snapshot to read and the token's position (None without ``pageToken``): a token
        pins its snapshot, and ``?snapshot`` may only repeat it."""
        snapshot = snapshot_param(params)
        token = params.get("pageToken")
        if token is None:
            return snapshot, None
        position = self.tokens.resolve(token, bound)
        if snapshot is not None and snapshot != position.snapshot:
            raise bad_request(
                f"query parameter 'snapshot' ({snapshot}) differs from the snapshot the page "
                f"token pins ({position.snapshot}); omit it or repeat it unchanged",
                parameter="snapshot",
            )
        return position.snapshot, position

    async def _versions(self, store: str, key: str, query_string: bytes) -> bytes:
        params = parse_query(query_string,
                             ("from", "to", "order", "pageSize", "pageToken", "snapshot"))
        if not key:
            raise bad_request("the key must not be empty")
        from_time, to_time, order, page_size = _range_params(params)
        query = PageQuery(store, key, from_time, to_time, order)
        snapshot, position = self._resume(params, query)
        resume_after = None if position is None else position.resume_after
        engine = self.require_engine()
        page = await self._call(
            store, snapshot, engine.versions, store,
            MultiVersionedKeyQuery(key, from_time, to_time, order == "asc"),
            snapshot=snapshot, resume_after=resume_after, limit=page_size,
        )
        next_token = None
        if page.resume_after is not None:
            next_token = self.tokens.issue(query, page.snapshot, page.resume_after)
        records = b",".join(
            b"".join((b'{"value":', r.value.encode("utf-8"), b',"timestamp":',
                      _int_or_null(r.timestamp), b',"validTo":', _int_or_null(r.valid_to), b"}"))
            for r in page.records
        )
        return b"".join((
            b'{"key":', _dumps(key), b',"records":[', records, b'],"nextPageToken":',
            _dumps(next_token), b',"snapshot":', _int_or_null(page.snapshot),
            b',"horizon":', _int_or_null(page.horizon), b"}",
        ))


async def _send(send: Send, status: int, body: bytes, content_type: str,
                headers: dict[str, str] | None = None) -> None:
    raw_headers = [(b"content-type", content_type.encode("latin-1")),
                   (b"content-length", str(len(body)).encode("ascii"))]
    for name, value in (headers or {}).items():
        raw_headers.append((name.encode("latin-1"), value.encode("latin-1")))
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": body})


async def _send_problem(send: Send, problem: Problem) -> None:
    await _send(send, problem.status, problem.body(), PROBLEM_MEDIA_TYPE, problem.headers)


#: Every resource answers GET, and HEAD (GET without the body, ``VersiqMiddleware``).
ALLOW = "GET, HEAD"


def _method_not_allowed(method: str) -> Problem:
    return Problem("method-not-allowed", f"{method} is not allowed here; use GET (or HEAD)", headers={"allow": ALLOW})


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
            elif method == "HEAD" and message["type"] == "http.response.body":
                message = {"type": "http.response.body", "body": b"", "more_body": message.get("more_body", False)}
            await send(message)

        raw_path: bytes = scope.get("raw_path") or scope["path"].encode("utf-8")
        raw_path = raw_path.split(b"?", 1)[0]
        template = "unmatched"
        try:
            if raw_path == b"/v1" or raw_path.startswith(b"/v1/"):
                template = await self._v1(scope, raw_path, send_wrapper)
            else:
                path = scope.get("path", "")
                if path in _OPS_ROUTES:
                    template = path
                if path == "/metrics":
                    problem = self.service.authorized(scope)
                    if problem is not None:
                        await _send_problem(send_wrapper, problem)
                        return
                await self.app(scope, receive, send_wrapper)
        finally:
            self.service.metrics.observe(method, template, status_box[0],
                                         time.perf_counter() - start)

    async def _v1(self, scope: Scope, raw_path: bytes, send: Send) -> str:
        template = "unmatched"
        try:
            problem = self.service.authorized(scope)
            if problem is not None:
                raise problem
            route = match_v1(split_path(raw_path))
            if route is None:
                raise Problem("route-not-found", f"no resource at {raw_path.decode('latin-1')!r}")
            template = route.template
            if scope["method"] != "GET":
                raise _method_not_allowed(scope["method"])
            body = await self.service.handle_v1(route, scope.get("query_string", b""))
            await _send(send, 200, body, JSON)
        except Problem as problem:
            await _send_problem(send, problem)
        except Exception:
            log.exception("internal error serving %s", raw_path.decode("latin-1"))
            await _send_problem(send, Problem("internal-error", "an internal error occurred; it "
                                              "has been logged"))
        return template


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
    openapi_bytes = _dumps(openapi_document())

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if owns_engine:
            from versiq.query.engine import Engine as EngineImpl

            started = EngineImpl(settings.warehouse, refresh_interval_s=settings.refresh_interval_s)
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
        if service.authorized(request.scope) is not None:
            # With auth on, an anonymous probe learns only whether the server is ready: store
            # names, snapshots, errors and paths are for token holders.
            state = {"ready": bool(state.get("ready"))}
            if state["ready"]:
                return JSONResponse(state)
            problem = Problem("not-ready", "not ready (details need a bearer token)", **state)
            return Response(problem.body(), status_code=503, media_type=PROBLEM_MEDIA_TYPE)
        if state.get("ready"):
            return JSONResponse(state)
        problem = Problem("not-ready", _not_ready_detail(state, service.engine is None), **state)
        return Response(problem.body(), status_code=503, media_type=PROBLEM_MEDIA_TYPE)

    @app.get("/metrics")
    async def metrics() -> Response:
        body = await run_in_threadpool(generate_latest, service.metrics.registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @app.get("/openapi.json")
    async def openapi() -> Response:
        return Response(openapi_bytes, media_type=JSON)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 404:
            problem = Problem("route-not-found", f"no resource at {request.url.path!r}")
        elif exc.status_code == 405:
            problem = _method_not_allowed(request.method)
        else:
            problem = Problem("bad-request", str(exc.detail))
            problem.status = exc.status_code
        return Response(problem.body(), status_code=problem.status, media_type=PROBLEM_MEDIA_TYPE,
                        headers=problem.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        problem = bad_request(f"invalid request: {exc.errors()}")
        return Response(problem.body(), status_code=400, media_type=PROBLEM_MEDIA_TYPE)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> Response:
        log.error("internal error serving %s", request.url.path, exc_info=exc)
        problem = Problem("internal-error", "an internal error occurred; it has been logged")
        return Response(problem.body(), status_code=500, media_type=PROBLEM_MEDIA_TYPE)

    app.add_middleware(VersiqMiddleware, service=service)
    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(settings.cors_origins),
                           allow_methods=["GET"], allow_headers=["Authorization"])
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
