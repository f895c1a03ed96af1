"""Errors as RFC 9457 problems, in one place: the query engine's errors (``query.api``) become
the problem types of openapi.yaml here, and every response of a problem goes out through
``problem_response`` / ``send_problem``.
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import Response
from starlette.types import Send

from versiq.query.api import (
    InvalidQuery,
    QueryError,
    RecordNotFound,
    SnapshotGone,
    SnapshotNotFound,
    StoreNotFound,
    StoreUnavailable,
    StreamNotFound,
    StreamUnavailable,
    UnsupportedQuery,
)
from versiq.service.problems import PROBLEM_MEDIA_TYPE, Problem, bad_request

#: Every resource answers GET, and HEAD (GET without the body).
ALLOW = "GET, HEAD"


def query_problem(exc: QueryError, what: str, store: str, snapshot: int | None, retry_after_s: float) -> Problem:
    """The problem for an engine error about ``what`` (``store`` or ``stream``) named ``store``."""
    name: dict[str, Any] = {what: store}
    detail = str(exc)
    if isinstance(exc, StoreNotFound):
        return Problem("store-not-found", detail or f"no store {store!r} in the warehouse", store=store)
    if isinstance(exc, StreamNotFound):
        return Problem("stream-not-found", detail or f"no stream {store!r} in the warehouse", stream=store)
    if isinstance(exc, (StoreUnavailable, StreamUnavailable)):
        # the engine retries at every refresh: worth asking again after one interval
        retry = {"retry-after": str(max(1, round(retry_after_s)))}
        return Problem(f"{what}-unavailable", detail, headers=retry, **name)
    if isinstance(exc, SnapshotNotFound):
        return Problem("snapshot-not-found", detail or f"{what} {store!r} has no snapshot {snapshot}",
                       **name, snapshot=snapshot)
    if isinstance(exc, SnapshotGone):
        return Problem("gone", detail or f"snapshot {snapshot} of {what} {store!r} is no longer readable (vacuumed)",
                       **name, snapshot=snapshot)
    if isinstance(exc, RecordNotFound):
        return Problem("record-not-found", detail, store=store, snapshot=snapshot)
    if isinstance(exc, InvalidQuery):
        return bad_request(detail or "invalid query")
    if isinstance(exc, UnsupportedQuery):
        return Problem("unsupported-query", detail or "the query does not apply to this store", store=store)
    raise exc  # a QueryError without a problem type is a bug: the caller answers 500


def method_not_allowed(method: str, allowed: str = "GET") -> Problem:
    if allowed == "POST":
        return Problem("method-not-allowed", f"{method} is not allowed here; use POST", headers={"allow": "POST"})
    return Problem("method-not-allowed", f"{method} is not allowed here; use GET (or HEAD)", headers={"allow": ALLOW})


def internal_error() -> Problem:
    return Problem("internal-error", "an internal error occurred; it has been logged")


def problem_response(problem: Problem) -> Response:
    """A problem as a framework response (FastAPI's own routes and exception handlers)."""
    return Response(problem.body(), status_code=problem.status, media_type=PROBLEM_MEDIA_TYPE,
                    headers=problem.headers)


async def send(send: Send, status: int, body: bytes, content_type: str,
               headers: dict[str, str] | None = None) -> None:
    """One complete ASGI response (the raw-path ``/v1`` router answers without the framework)."""
    raw_headers = [(b"content-type", content_type.encode("latin-1")),
                   (b"content-length", str(len(body)).encode("ascii"))]
    for name, value in (headers or {}).items():
        raw_headers.append((name.encode("latin-1"), value.encode("latin-1")))
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": body})


async def send_problem(send_: Send, problem: Problem) -> None:
    await send(send_, problem.status, problem.body(), PROBLEM_MEDIA_TYPE, problem.headers)
