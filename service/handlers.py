"""The ``/v1`` handlers: one coroutine per route of ``service.routes``, each parsing its query
parameters (``service.params``), asking the engine in the thread pool and rendering the answer
(``service.render``). All query logic is in ``versiq.query``; engine errors become problems in
``service.errors``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

from starlette.concurrency import run_in_threadpool

from versiq.durations import DurationError, parse_duration_ms
from versiq.names import is_valid_store_name
from versiq.query.api import KeyResult, KeysQuery, MultiVersionedKeyQuery, QueryError, VersionedKeyQuery
from versiq.query.lookups import (
    MAX_LOOKUPS,
    LookupInputError,
    answers_table,
    arrow_stream_bytes,
    parquet_bytes,
    read_pairs,
)
from versiq.query.published import wait_event
from versiq.query.streams import StreamPosition, StreamRecordsQuery
from versiq.service.bodies import BodyBudget, parse_json
from versiq.service.errors import query_problem
from versiq.service.metrics import Metrics
from versiq.service.params import (
    MAX_INT64,
    bool_param,
    order_param,
    page_size_param,
    parse_query,
    snapshot_param,
    timestamp_param,
)
from versiq.service.problems import Problem, bad_request
from versiq.service.render import (
    JSON,
    batch_json,
    change_lines,
    changes_json,
    dumps,
    history_json,
    key_json,
    keys_json,
    rejected_json,
    rejected_record_json,
    result_lines,
    store_info_json,
    stream_info_json,
    stream_records_json,
    versions_json,
)
from versiq.service.routes import (
    ROUTE_BATCH_GET,
    ROUTE_CHANGES,
    ROUTE_HISTORY,
    ROUTE_KEY,
    ROUTE_KEYS,
    ROUTE_REJECTED,
    ROUTE_REJECTED_RECORD,
    ROUTE_STORE,
    ROUTE_STORES,
    ROUTE_STREAM,
    ROUTE_STREAM_RECORDS,
    ROUTE_STREAMS,
    ROUTE_VERSIONS,
    Route,
)
from versiq.service.settings import Settings
from versiq.service.tokens import CHANGES, KEYS, REJECTED, STREAM_RECORDS, PageQuery, PageTokens
from versiq.timestamps import TimestampError, human_instant, parse_timestamp

if TYPE_CHECKING:
    from versiq.query.engine import Engine

log = logging.getLogger("versiq.service")

_NAME_RULE = "1-100 letters, digits, '_', '-' or '.', starting with a letter or digit"
#: Keys one ``keys:batchGet`` request may ask for.
MAX_BATCH_KEYS = 1000
#: JSON objects a ``keys:batchGet`` body may hold (the body itself; keys are strings).
MAX_BATCH_OBJECTS = 1
#: JSON objects a ``lookups`` body may hold: the body and one per pair.
MAX_LOOKUP_OBJECTS = MAX_LOOKUPS + 1


def _range_params(params: dict[str, str]) -> tuple[int | None, int | None, str, int]:
    """``from``, ``to`` (checked in order), ``order`` and ``pageSize`` of a listing."""
    from_time = timestamp_param(params, "from")
    to_time = timestamp_param(params, "to")
    if from_time is not None and to_time is not None and from_time > to_time:
        raise bad_request(f"'from' ({from_time}) is after 'to' ({to_time})", parameter="from")
    return from_time, to_time, order_param(params), page_size_param(params)


def _checked_name(name: str | None, what: str) -> str:
    """A store or stream name from the path; a name no table can have is a 404 at once."""
    name = name or ""
    if not is_valid_store_name(name):
        extension: dict[str, Any] = {what: name}
        raise Problem(f"{what}-not-found", f"no {what} named {name!r}: {what} names are {_NAME_RULE}", **extension)
    return name


def _human(millis: int | None) -> str:
    """A time in a problem's detail: RFC 3339 with the epoch ms the fields carry (``+inf``: none)."""
    return "+inf" if millis is None else human_instant(millis)


def key_problem(store: str, key: str, as_of: int | None, result: KeyResult) -> Problem:
    """Why ``key`` has no value: the 404 of ``GET .../keys/{key}``, and the per-key problem of a
    ``keys:batchGet`` answer."""
    when = "now (latest)" if as_of is None else f"as of {human_instant(as_of)}"
    extra: dict[str, Any] = {"key": key, "snapshot": result.snapshot, "horizon": result.horizon}
    if result.outcome == "expired":
        return Problem(
            "expired",
            f"asOf {_human(as_of)} is older than the history-retention horizon {_human(result.horizon)} "
            f"(stream time - historyRetentionMs of the key's partition) of store {store!r} at "
            f"snapshot {result.snapshot}; the latest version of key {key!r} is newer than "
            "that, so no answer can be given",
            **extra,
        )
    if result.deleted_at is not None:
        return Problem("not-found", f"key {key!r} has no value {when} in store {store!r} at snapshot "
                       f"{result.snapshot}: it was deleted at {human_instant(result.deleted_at)} (a tombstone)",
                       **extra, deletedAt=result.deleted_at)
    return Problem("not-found", f"key {key!r} has no value {when} in store {store!r} at "
                   f"snapshot {result.snapshot}", **extra)


def _body_timestamp(request: dict[str, Any], name: str) -> int | None:
    """A timestamp field of a JSON body: epoch ms or RFC 3339 text (400 naming the field)."""
    value = request.get(name)
    if isinstance(value, str):
        try:
            return parse_timestamp(value)
        except TimestampError as exc:
            raise bad_request(f"'{name}': {exc}", field=name) from None
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_INT64):
        raise bad_request(f"'{name}' must be epoch milliseconds (a non-negative integer) or an RFC 3339 instant",
                          field=name)
    return value


#: The longest a change-feed request may wait for the next commit.
MAX_WAIT_S = 60.0


def _feed_params(params: dict[str, str]) -> tuple[int, int | None]:
    """``sinceSnapshot`` (required; ``-1``: from the first commit) and ``untilSnapshot``."""
    text = params.get("sinceSnapshot")
    if text is None:
        raise bad_request("query parameter 'sinceSnapshot' is required (-1: from the first commit)",
                          parameter="sinceSnapshot")
    since = -1 if text == "-1" else snapshot_param(params, "sinceSnapshot")
    assert since is not None
    return since, snapshot_param(params, "untilSnapshot")


def _wait_param(params: dict[str, str]) -> float:
    """``wait`` of the change feed: a duration (``30s``, ``500ms``, ``PT30S``), at most 60 s."""
    text = params.get("wait")
    if text is None:
        return 0.0
    try:
        millis = parse_duration_ms(text)
    except DurationError as exc:
        raise bad_request(f"query parameter 'wait': {exc}", parameter="wait") from None
    if not 0 <= millis <= MAX_WAIT_S * 1000:
        raise bad_request(f"query parameter 'wait' must be from 0 to {MAX_WAIT_S:g}s", parameter="wait")
    return millis / 1000


def min_snapshot_wait_s(refresh_interval_s: float) -> float:
    """How long a read with ``minSnapshot`` waits for that snapshot: three refresh intervals,
    at least 2 s and at most 30 s."""
    return min(30.0, max(2.0, 3 * refresh_interval_s))


def _check_min(snapshot: int, min_snapshot: int) -> None:
    if snapshot < min_snapshot:
        raise bad_request(f"the snapshot asked for ({snapshot}) is older than minSnapshot ({min_snapshot})",
                          parameter="minSnapshot")


NDJSON = "application/x-ndjson"
ARROW = "application/vnd.apache.arrow.stream"
PARQUET = "application/vnd.apache.parquet"
#: Tables a lookup can be sent as and answered with.
TABLE_MEDIA_TYPES = (ARROW, PARQUET)


def negotiate(accept: str | None) -> str:
    """The answer's media type for ``Accept``: the first of JSON, NDJSON, Arrow or Parquet it
    names (parameters and q-values are not weighed: order decides), JSON for none or ``*/*``;
    406 when it names only others."""
    if not accept:
        return JSON
    for item in accept.split(","):
        media = item.split(";", 1)[0].strip().lower()
        if media in (JSON, NDJSON, *TABLE_MEDIA_TYPES):
            return media
        if media in ("*/*", "application/*"):
            return JSON
    raise Problem("not-acceptable", f"lookups answer {JSON}, {NDJSON}, {ARROW} or {PARQUET}; Accept names "
                  f"none of them ({accept!r})")


def _lookup_request(request: Any) -> tuple[list[tuple[str, int | None]], dict[str, Any]]:
    """The pairs of a JSON ``lookups`` body, and its snapshot fields."""
    if not isinstance(request, dict):
        raise bad_request('the request body must be a JSON object such as {"lookups": [{"key": "k1", "asOf": 5}]}')
    unknown = sorted(set(request) - {"lookups", "snapshot", "asOfSystemTime", "minSnapshot"})
    if unknown:
        raise bad_request(f"unknown field(s) in the request body: {', '.join(unknown)} (accepted: lookups, "
                          "snapshot, asOfSystemTime, minSnapshot)", field=unknown[0])
    items = request.get("lookups")
    if not isinstance(items, list) or not items:
        raise bad_request("'lookups' must be a non-empty array of {\"key\", \"asOf\"?} objects", field="lookups")
    if len(items) > MAX_LOOKUPS:
        raise bad_request(f"'lookups' has {len(items)} pairs; at most {MAX_LOOKUPS} per request", field="lookups")
    pairs: list[tuple[str, int | None]] = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or set(item) - {"key", "asOf"}:
            raise bad_request(f"'lookups[{i}]' must be an object with 'key' and an optional 'asOf'", field="lookups")
        key = item.get("key")
        if not isinstance(key, str) or not key:
            raise bad_request(f"'lookups[{i}].key' must be a non-empty string", field="lookups")
        pairs.append((key, _body_timestamp(item, "asOf")))
    fields: dict[str, Any] = {}
    for name in ("snapshot", "minSnapshot"):
        value = _body_version(request, name)
        if value is not None:
            fields[name] = value
    system_time = _body_timestamp(request, "asOfSystemTime")
    if system_time is not None:
        fields["asOfSystemTime"] = system_time
    return pairs, fields


def _lookup_json(raw: bytes) -> tuple[list[tuple[str, int | None]], dict[str, Any]]:
    """``_lookup_request`` of a raw JSON body: parsed and checked together in the thread pool
    (100,000 pairs take a good part of a second, which the event loop must not wait for)."""
    return _lookup_request(parse_json(raw, MAX_LOOKUP_OBJECTS))


def _body_version(request: dict[str, Any], name: str) -> int | None:
    """A Delta-version field of a JSON body (``snapshot``, ``minSnapshot``); 400 naming it."""
    value = request.get(name)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_INT64):
        raise bad_request(f"'{name}' must be a Delta version (a non-negative integer)", field=name)
    return value


def _batch_request(request: Any) -> tuple[list[str], int | None, int | None]:
    """The keys, asOf and snapshot of a ``keys:batchGet`` body (400 with the field otherwise)."""
    if not isinstance(request, dict):
        raise bad_request("the request body must be a JSON object such as {\"keys\": [\"k1\", \"k2\"]}")
    unknown = sorted(set(request) - {"keys", "asOf", "snapshot", "asOfSystemTime", "minSnapshot"})
    if unknown:
        raise bad_request(f"unknown field(s) in the request body: {', '.join(unknown)} (names are "
                          "case-sensitive; accepted: keys, asOf, snapshot, asOfSystemTime, minSnapshot)",
                          field=unknown[0])
    keys = request.get("keys")
    if not isinstance(keys, list) or not keys:
        raise bad_request("'keys' must be a non-empty array of keys (strings)", field="keys")
    if len(keys) > MAX_BATCH_KEYS:
        raise bad_request(f"'keys' has {len(keys)} keys; at most {MAX_BATCH_KEYS} per request", field="keys")
    for i, key in enumerate(keys):
        if not isinstance(key, str) or not key:
            raise bad_request(f"'keys[{i}]' must be a non-empty string", field="keys")
    as_of = _body_timestamp(request, "asOf")
    return keys, as_of, _body_version(request, "snapshot")


class Service:
    """Per-app state: the engine, page tokens and metrics, and the ``/v1`` handlers."""

    def __init__(self, settings: Settings, engine: Engine | None) -> None:
        self.settings = settings
        self.engine = engine
        self.tokens = PageTokens(settings.token_secret, settings.token_ttl_s)
        self.bodies = BodyBudget(settings.body_budget_bytes)
        self.metrics = Metrics(self.readiness, lambda: float(self.bodies.used))
        self._routes: dict[str, Callable[[Route, bytes], Awaitable[bytes]]] = {
            ROUTE_STORES: self._stores,
            ROUTE_STORE: self._store,
            ROUTE_KEYS: self._keys,
            ROUTE_HISTORY: self._history,
            ROUTE_REJECTED: self._rejected,
            ROUTE_REJECTED_RECORD: self._rejected_record,
            ROUTE_CHANGES: self._changes,
            ROUTE_KEY: self._get,
            ROUTE_VERSIONS: self._versions,
            ROUTE_STREAMS: self._streams,
            ROUTE_STREAM: self._stream,
            ROUTE_STREAM_RECORDS: self._stream_records,
        }

    def readiness(self) -> dict[str, Any]:
        if self.engine is None:
            return {"ready": False, "stores": {}, "streams": {}, "refused": {}, "unavailable": {}}
        return self.engine.readiness()

    def require_engine(self) -> Engine:
        if self.engine is None:
            raise Problem("not-ready", "the query engine is not started")
        return self.engine

    async def handle_v1(self, route: Route, query_string: bytes) -> bytes:
        """The body of the 200 answer to ``route``; raises ``Problem`` otherwise."""
        return await self._routes[route.template](route, query_string)

    async def handle_post(self, route: Route, query_string: bytes, request: Any) -> bytes:
        """The body of the 200 answer to a POST ``route`` with JSON body ``request``."""
        assert route.template == ROUTE_BATCH_GET
        return await self._batch_get(route, query_string, request)

    async def _call(self, name: str, at: int | None, fn: Callable[..., Any], *args: Any,
                    what: str = "store", inline: bool = False, **kwargs: Any) -> Any:
        """Run an engine call in the thread pool (``inline``: on the event loop, for a read of
        one key from the serving index, which takes microseconds and no I/O but mapped pages:
        the thread hop would cost more than the read); its errors become problems about
        ``what`` (``store`` or ``stream``) ``name`` read at snapshot ``at``."""
        try:
            if inline:
                return fn(*args, **kwargs)
            return await run_in_threadpool(fn, *args, **kwargs)
        except QueryError as exc:
            raise query_problem(exc, what, name, at, self.settings.refresh_interval_s) from None

    async def _snapshot(self, name: str, params: dict[str, str], what: str = "store", *,
                        explicit: int | None = None, system_time: int | None = None,
                        min_snapshot: int | None = None, apply_min: bool = True) -> int | None:
        """The snapshot a read asks for: ``snapshot``, or the newest one committed at or before
        ``asOfSystemTime`` (system time); None = the current one. With
        ``minSnapshot`` (read your writes, item 7) the answer comes from a snapshot at least that
        new: a named one must be, and the current one is waited for (``_await_snapshot``)."""
        snapshot = explicit if explicit is not None else snapshot_param(params)
        if system_time is None:
            system_time = timestamp_param(params, "asOfSystemTime")
        if min_snapshot is None:
            min_snapshot = snapshot_param(params, "minSnapshot")
        if system_time is not None:
            if snapshot is not None:
                raise bad_request("give 'snapshot' or 'asOfSystemTime', not both", parameter="asOfSystemTime")
            engine = self.require_engine()
            snapshot = await self._call(name, None, engine.snapshot_at, name, system_time, what, what=what)
        if min_snapshot is None or not apply_min:
            return snapshot
        if snapshot is not None:
            _check_min(snapshot, min_snapshot)
            return snapshot
        return await self._await_snapshot(name, min_snapshot, what)

    async def _await_snapshot(self, name: str, at_least: int, what: str) -> int:
        """The current snapshot of ``name`` once it is ``>= at_least``: a commit that has landed
        but is not loaded yet is waited for, up to ``min_snapshot_wait_s``, then 503 with
        ``Retry-After``; a snapshot not committed at all is a 404 at once."""
        engine = self.require_engine()
        current_of = engine.current_stream_snapshot if what == "stream" else engine.current_snapshot
        deadline = time.monotonic() + min_snapshot_wait_s(self.settings.refresh_interval_s)
        newest: int = await self._call(name, None, engine.newest_committed, name, what, what=what)
        if newest < at_least:  # not committed at all: nothing to wait for
            named: dict[str, Any] = {what: name}
            raise Problem("snapshot-not-found", f"{what} {name!r} has no snapshot {at_least} (minSnapshot): its newest "
                          f"commit is {newest}", **named, snapshot=at_least)
        while True:
            event = engine.next_snapshot_event(name)  # before the look: a later snapshot sets it
            current: int = await self._call(name, None, current_of, name, what=what, inline=True)
            if current >= at_least:
                return current
            if not await wait_event(event, deadline - time.monotonic()):
                retry = {"retry-after": str(max(1, round(self.settings.refresh_interval_s)))}
                raise Problem(f"{what}-unavailable",
                              f"{what} {name!r} is at snapshot {current} here; minSnapshot {at_least} is not "
                              "loaded yet (it may not be committed, or this server has not refreshed): retry",
                              headers=retry, **{what: name}, snapshot=current, minSnapshot=at_least)

    async def _resume(self, params: dict[str, str], bound: PageQuery, what: str = "store") -> tuple[int | None, Any]:
        """The snapshot to read and the token's position (None without ``pageToken``): a token
        pins its snapshot, and ``?snapshot`` (or ``asOfSystemTime``) may only name it again,
        ``minSnapshot`` may not be newer."""
        token = params.get("pageToken")
        snapshot = await self._snapshot(bound.store, params, what, apply_min=token is None)
        if token is None:
            return snapshot, None
        position = self.tokens.resolve(token, bound)
        min_snapshot = snapshot_param(params, "minSnapshot")
        if min_snapshot is not None:
            _check_min(position.snapshot, min_snapshot)
        if snapshot is not None and snapshot != position.snapshot:
            raise bad_request(
                f"the snapshot asked for ({snapshot}) differs from the snapshot the page "
                f"token pins ({position.snapshot}); omit 'snapshot'/'asOfSystemTime' or repeat it unchanged",
                parameter="snapshot",
            )
        return position.snapshot, position

    # ------------------------------------------------------------------ stores
    async def _stores(self, route: Route, query_string: bytes) -> bytes:
        parse_query(query_string, ())
        engine = self.require_engine()
        stores = await run_in_threadpool(engine.list_stores)
        unavailable = await run_in_threadpool(engine.unavailable)
        return dumps({"stores": [store_info_json(s) for s in stores],
                      "unavailable": [{"name": name, "error": error} for name, error in unavailable.items()]})

    async def _store(self, route: Route, query_string: bytes) -> bytes:
        store = _checked_name(route.store, "store")
        snapshot = await self._snapshot(store, parse_query(query_string, ("snapshot", "asOfSystemTime",
                                                                          "minSnapshot")))
        engine = self.require_engine()
        info = await self._call(store, snapshot, engine.store_info, store, snapshot)
        return dumps(store_info_json(info))

    async def _changes(self, route: Route, query_string: bytes) -> bytes:
        """``GET /v1/stores/{store}/changes``, paged; with ``wait`` a request at
        the head waits up to that long for the next commit instead of answering empty."""
        store = _checked_name(route.store, "store")
        params = parse_query(query_string, ("sinceSnapshot", "untilSnapshot", "pageSize", "pageToken", "wait"))
        since, until = _feed_params(params)
        page_size = page_size_param(params)
        wait_s = _wait_param(params)
        engine = self.require_engine()
        bound = PageQuery(store, None, since, until, "asc", CHANGES)
        resume: tuple[int, str, int] | None = None
        token = params.get("pageToken")
        if token is not None:
            position = self.tokens.resolve(token, bound)
            if len(position.position) != 3:
                raise bad_request("query parameter 'pageToken' is not a valid page token", parameter="pageToken")
            snapshot_, key_, valid_from_ = position.position
            resume = (int(snapshot_), str(key_), int(valid_from_))
            until = position.snapshot
        elif until is None:
            await self._wait_for_commit(store, since, wait_s)
        page = await self._call(store, until, engine.changes, store, since, until, resume, page_size)
        next_token = None
        if page.resume_after is not None:
            next_token = self.tokens.issue(bound, page.snapshot, page.resume_after)
        return changes_json(store, page, next_token)

    async def _wait_for_commit(self, store: str, since: int, wait_s: float) -> None:
        """Long poll: return once ``store`` has a snapshot after ``since``, or after ``wait_s``.
        A ``since`` the store has not committed is a 400 at once, not after the wait. Waiting
        holds no thread and polls nothing: the coroutine sleeps until the catalog publishes a
        new snapshot of the store (``Engine.next_snapshot_event``)."""
        engine = self.require_engine()
        deadline = time.monotonic() + wait_s
        checked = False
        while True:
            event = engine.next_snapshot_event(store)  # before the look: a later snapshot sets it
            current: int = await self._call(store, None, engine.current_snapshot, store, inline=True)
            if current > since:
                return
            if not checked and since > current:
                await self._check_since(store, since)
            checked = True
            if not await wait_event(event, deadline - time.monotonic()):
                return

    async def _check_since(self, store: str, since: int) -> None:
        """400 when ``since`` is newer than every snapshot ``store`` has committed (a commit this
        server has not loaded yet is worth waiting for)."""
        engine = self.require_engine()
        newest: int = await self._call(store, None, engine.newest_committed, store)
        if since > newest:
            raise bad_request(f"sinceSnapshot ({since}) must be -1 (from the start) or a snapshot of store "
                              f"{store!r}: its newest is {newest}", parameter="sinceSnapshot")

    async def changes_stream(self, route: Route, query_string: bytes) -> tuple[dict[str, str], AsyncIterator[bytes]]:
        """The change feed as NDJSON in one pass (``Accept: application/x-ndjson``): every change
        of ``(sinceSnapshot, untilSnapshot]``, one object per line as in the paged answer, sent
        as it is read; the snapshot the feed runs to is the ``Versiq-Snapshot`` header. Errors
        found before the first line are problems; a commit whose files vanish mid-stream ends
        the stream early (logged)."""
        store = _checked_name(route.store, "store")
        params = parse_query(query_string, ("sinceSnapshot", "untilSnapshot", "wait", "pageSize", "pageToken"))
        for name in ("pageSize", "pageToken"):  # accepted by the route, meaningless for a stream
            if name in params:
                raise bad_request(f"query parameter {name!r} pages the JSON answer; the NDJSON stream "
                                  "(Accept: application/x-ndjson) sends the whole window in one answer: "
                                  "leave it out, or page with Accept: application/json", parameter=name)
        since, until = _feed_params(params)
        if until is None:
            await self._wait_for_commit(store, since, _wait_param(params))
        engine = self.require_engine()
        snapshot, batches = await self._call(store, until, engine.stream_changes, store, since, until)
        first = await self._call(store, snapshot, next, batches, None)

        async def lines() -> AsyncIterator[bytes]:
            item = first
            while item is not None:
                yield await run_in_threadpool(change_lines, *item)
                try:
                    item = await run_in_threadpool(next, batches, None)
                except QueryError:
                    log.exception("change feed of store %s ended early", store)
                    return

        return {"versiq-snapshot": str(snapshot)}, lines()

    async def _history(self, route: Route, query_string: bytes) -> bytes:
        store = _checked_name(route.store, "store")
        parse_query(query_string, ())
        engine = self.require_engine()
        commits = await self._call(store, None, engine.history, store)
        return history_json(store, commits)

    async def _rejected(self, route: Route, query_string: bytes) -> bytes:
        """``GET /v1/stores/{store}/rejected``: the input records the store's committed runs
        rejected, filterable by reason, paged; the token pins the snapshot and the reason."""
        store = _checked_name(route.store, "store")
        params = parse_query(query_string, ("reason", "pageSize", "pageToken", "snapshot", "asOfSystemTime",
                                            "minSnapshot"))
        reason = params.get("reason")
        page_size = page_size_param(params)
        bound = PageQuery(store, reason, None, None, "asc", REJECTED)
        snapshot, position = await self._resume(params, bound)
        resume_after = None if position is None else position.resume_after
        engine = self.require_engine()
        page = await self._call(store, snapshot, engine.rejected, store, reason, snapshot=snapshot,
                                resume_after=resume_after, limit=page_size)
        next_token = None
        if page.resume_after is not None:
            next_token = self.tokens.issue(bound, page.snapshot, page.resume_after)
        return rejected_json(store, page, next_token)

    async def _rejected_record(self, route: Route, query_string: bytes) -> bytes:
        """``GET /v1/stores/{store}/rejected/{id}``: one rejected record with its raw text whole
        (a listing shows the start of a long one)."""
        store = _checked_name(route.store, "store")
        text = route.record or ""
        if not text.isascii() or not text.isdigit() or len(text) > 18:
            raise bad_request(f"the record id {text!r} is not an id of a listed record (a non-negative integer)")
        snapshot = await self._snapshot(store, parse_query(query_string, ("snapshot", "asOfSystemTime",
                                                                          "minSnapshot")))
        engine = self.require_engine()
        answered, record = await self._call(store, snapshot, engine.rejected_record, store, int(text), snapshot)
        return rejected_record_json(store, answered, record)

    async def _get(self, route: Route, query_string: bytes) -> bytes:
        store = _checked_name(route.store, "store")
        key = route.key or ""
        params = parse_query(query_string, ("asOf", "snapshot", "asOfSystemTime", "minSnapshot"))
        if not key:
            raise bad_request("the key must not be empty")
        as_of = timestamp_param(params, "asOf")
        snapshot = await self._snapshot(store, params)
        engine = self.require_engine()
        result = await self._call(store, snapshot, engine.get, store,
                                  VersionedKeyQuery(key, as_of), snapshot=snapshot, inline=snapshot is None)
        if result.outcome == "ok" and result.record is not None:
            return key_json(key, result)
        raise key_problem(store, key, as_of, result)

    async def _versions(self, route: Route, query_string: bytes) -> bytes:
        store = _checked_name(route.store, "store")
        key = route.key or ""
        params = parse_query(query_string,
                             ("from", "to", "order", "includeDeleted", "pageSize", "pageToken", "snapshot",
                              "asOfSystemTime", "minSnapshot"))
        if not key:
            raise bad_request("the key must not be empty")
        from_time, to_time, order, page_size = _range_params(params)
        include_deleted = bool_param(params, "includeDeleted")
        query = PageQuery(store, key, from_time, to_time, order, include_deleted=include_deleted)
        snapshot, position = await self._resume(params, query)
        resume_after = None if position is None else position.resume_after
        engine = self.require_engine()
        page = await self._call(
            store, snapshot, engine.versions, store,
            MultiVersionedKeyQuery(key, from_time, to_time, order == "asc", include_deleted),
            snapshot=snapshot, resume_after=resume_after, limit=page_size, inline=snapshot is None,
        )
        if page.expired:
            raise Problem(
                "expired",
                f"the range [{'-inf' if from_time is None else _human(from_time)}, {_human(to_time)}] lies wholly "
                f"before the history-retention horizon {_human(page.horizon)} (stream time - historyRetentionMs "
                f"of the key's partition) of store {store!r} at snapshot {page.snapshot}, and the latest version "
                f"of key {key!r} is newer than {_human(to_time)}: no answer can be given",
                key=key, snapshot=page.snapshot, horizon=page.horizon,
            )
        next_token = None
        if page.resume_after is not None:
            next_token = self.tokens.issue(query, page.snapshot, page.resume_after)
        return versions_json(key, page, next_token)

    async def _keys(self, route: Route, query_string: bytes) -> bytes:
        store = _checked_name(route.store, "store")
        params = parse_query(query_string, ("prefix", "start", "end", "asOf", "includeDeleted", "pageSize",
                                            "pageToken", "snapshot", "asOfSystemTime", "minSnapshot"))
        prefix, start, end = params.get("prefix"), params.get("start"), params.get("end")
        if start is not None and end is not None and start > end:
            raise bad_request(f"'start' ({start!r}) is after 'end' ({end!r})", parameter="start")
        as_of = timestamp_param(params, "asOf")
        include_deleted = bool_param(params, "includeDeleted")
        page_size = page_size_param(params)
        bound = PageQuery(store, dumps([prefix, start, end, include_deleted]).decode("utf-8"), as_of, None,
                          "asc", KEYS)
        snapshot, position = await self._resume(params, bound)
        resume_after: str | None = None
        if position is not None:
            if len(position.position) != 1 or not isinstance(position.position[0], str):
                raise bad_request("query parameter 'pageToken' is not a valid page token", parameter="pageToken")
            resume_after = position.position[0]
        engine = self.require_engine()
        page = await self._call(
            store, snapshot, engine.keys, store, KeysQuery(prefix, start, end, as_of, include_deleted),
            snapshot=snapshot, resume_after=resume_after, limit=page_size,
        )
        next_token = None
        if page.resume_after is not None:
            next_token = self.tokens.issue(bound, page.snapshot, (page.resume_after,))
        return keys_json(store, page, next_token)

    async def _batch_get(self, route: Route, query_string: bytes, request: Any) -> bytes:
        store = _checked_name(route.store, "store")
        parse_query(query_string, ())
        keys, as_of, snapshot = _batch_request(request)
        snapshot = await self._snapshot(store, {}, explicit=snapshot,
                                        system_time=_body_timestamp(request, "asOfSystemTime"),
                                        min_snapshot=_body_version(request, "minSnapshot"))
        engine = self.require_engine()
        answered, results = await self._call(store, snapshot, engine.get_many, store, keys, as_of, snapshot)
        problems = {i: key_problem(store, key, as_of, r).payload()
                    for i, (key, r) in enumerate(zip(keys, results, strict=True))
                    if r.outcome != "ok" or r.record is None}
        return batch_json(store, answered, keys, as_of, results, problems)

    async def lookups(self, route: Route, query_string: bytes, media_type: str, raw: bytes,
                      accept: str | None) -> tuple[str, list[bytes]]:
        """``POST /v1/stores/{store}/lookups``: the content type and body chunks
        of the answers to many ``(key, asOf)`` pairs from one snapshot, as JSON, NDJSON (one
        result per chunk of lines), an Arrow IPC stream or Parquet, per ``Accept``."""
        store = _checked_name(route.store, "store")
        params = parse_query(query_string, ("snapshot", "asOfSystemTime", "minSnapshot"))
        answer_type = negotiate(accept)
        fields: dict[str, Any] = {}
        if media_type == "application/json":
            pairs, fields = await run_in_threadpool(_lookup_json, raw)
        elif media_type in TABLE_MEDIA_TYPES:
            try:
                pairs = await run_in_threadpool(read_pairs, raw, media_type)
            except LookupInputError as exc:
                raise bad_request(str(exc)) from None
        else:
            raise Problem("unsupported-media-type", "the request body must be application/json, "
                          f"{' or '.join(TABLE_MEDIA_TYPES)}, not {media_type or 'missing'!r}")
        if fields and any(name in params for name in ("snapshot", "asOfSystemTime", "minSnapshot")):
            raise bad_request("name the snapshot in the query string or in the body, not both")
        snapshot = await self._snapshot(store, params, explicit=fields.get("snapshot"),
                                        system_time=fields.get("asOfSystemTime"),
                                        min_snapshot=fields.get("minSnapshot"))
        engine = self.require_engine()
        answered, results = await self._call(store, snapshot, engine.lookup, store, pairs, snapshot)
        if answer_type in TABLE_MEDIA_TYPES:
            table = answers_table(pairs, results, answered)
            encode = parquet_bytes if answer_type == PARQUET else arrow_stream_bytes
            return answer_type, [await run_in_threadpool(encode, table)]
        problems = {i: key_problem(store, key, as_of, r).payload()
                    for i, ((key, as_of), r) in enumerate(zip(pairs, results, strict=True))
                    if r.outcome != "ok" or r.record is None}
        lines = result_lines(pairs, results, problems)
        if answer_type == NDJSON:
            return NDJSON, [b"".join(line + b"\n" for line in lines[i:i + 1000]) for i in range(0, len(lines), 1000)]
        return JSON, [b"".join((b'{"store":', dumps(store), b',"snapshot":', str(answered).encode(),
                                b',"results":[', b",".join(lines), b"]}"))]

    # ------------------------------------------------------------------ streams
    async def _streams(self, route: Route, query_string: bytes) -> bytes:
        parse_query(query_string, ())
        engine = self.require_engine()
        streams = await run_in_threadpool(engine.list_streams)
        return dumps({"streams": [stream_info_json(s) for s in streams]})

    async def _stream(self, route: Route, query_string: bytes) -> bytes:
        stream = _checked_name(route.stream, "stream")
        params = parse_query(query_string, ("snapshot", "asOfSystemTime", "minSnapshot"))
        snapshot = await self._snapshot(stream, params, "stream")
        engine = self.require_engine()
        info = await self._call(stream, snapshot, engine.stream_info, stream, snapshot, what="stream")
        return dumps(stream_info_json(info))

    async def _stream_records(self, route: Route, query_string: bytes) -> bytes:
        stream = _checked_name(route.stream, "stream")
        params = parse_query(query_string,
                             ("key", "from", "to", "order", "pageSize", "pageToken", "snapshot", "asOfSystemTime",
                              "minSnapshot"))
        key = params.get("key")
        if key == "":
            raise bad_request("query parameter 'key' must not be empty (omit it for every key)",
                              parameter="key")
        from_time, to_time, order, page_size = _range_params(params)
        bound = PageQuery(stream, key, from_time, to_time, order, STREAM_RECORDS)
        snapshot, position = await self._resume(params, bound, "stream")
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
        return stream_records_json(stream, key, page, next_token)
