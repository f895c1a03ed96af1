"""The route table of ``/v1``: which resource a raw path names, and its decoded parameters.

Routing is on the raw path (ASGI ``raw_path``), split on literal ``/``, each segment decoded once:
``a%2Fb`` is the key ``a/b`` and ``foo%2Fversions`` the key ``foo/versions``, never the versions
endpoint of ``foo`` (Starlette routes on the decoded path, which cannot tell them apart).
"""

from __future__ import annotations

from dataclasses import dataclass

from versiq.service.params import percent_decode


def split_path(raw_path: bytes) -> list[bytes]:
    """``/v1/stores/a%2Fb`` -> ``[b"v1", b"stores", b"a%2Fb"]`` (segments still encoded)."""
    path = raw_path.split(b"?", 1)[0]
    if path.startswith(b"/"):
        path = path[1:]
    return path.split(b"/")



@dataclass(frozen=True)
class Route:
    """A matched route: its template (for metrics) and decoded path parameters."""

    template: str
    store: str | None = None
    key: str | None = None
    stream: str | None = None
    #: The id of one rejected record (still text: the handler checks it).
    record: str | None = None


ROUTE_STORES = "/v1/stores"
ROUTE_STORE = "/v1/stores/{store}"
ROUTE_KEYS = "/v1/stores/{store}/keys"
ROUTE_BATCH_GET = "/v1/stores/{store}/keys:batchGet"
ROUTE_HISTORY = "/v1/stores/{store}/history"
ROUTE_LOOKUPS = "/v1/stores/{store}/lookups"
ROUTE_CHANGES = "/v1/stores/{store}/changes"
ROUTE_REJECTED = "/v1/stores/{store}/rejected"
ROUTE_REJECTED_RECORD = "/v1/stores/{store}/rejected/{id}"
ROUTE_KEY = "/v1/stores/{store}/keys/{key}"
ROUTE_VERSIONS = "/v1/stores/{store}/keys/{key}/versions"
ROUTE_STREAMS = "/v1/streams"
ROUTE_STREAM = "/v1/streams/{stream}"
ROUTE_STREAM_RECORDS = "/v1/streams/{stream}/records"

#: Routes answering POST (a JSON body); every other route answers GET (and HEAD).
POST_ROUTES = frozenset({ROUTE_BATCH_GET, ROUTE_LOOKUPS})


def _match_streams(segments: list[bytes]) -> Route | None:
    n = len(segments)
    if n == 2:
        return Route(ROUTE_STREAMS)
    if n > 4 or (n == 4 and segments[3] != b"records"):
        return None
    stream = percent_decode(segments[2], plus_is_space=False, what="the stream name")
    return Route(ROUTE_STREAM if n == 3 else ROUTE_STREAM_RECORDS, stream=stream)


def match_v1(segments: list[bytes]) -> Route | None:
    """Match the segments of a ``/v1/...`` raw path; None = no such route."""
    n = len(segments)
    if n >= 2 and segments[0] == b"v1" and segments[1] == b"streams":
        return _match_streams(segments)
    if n < 2 or segments[0] != b"v1" or segments[1] != b"stores":
        return None
    if n == 2:
        return Route(ROUTE_STORES)
    store = percent_decode(segments[2], plus_is_space=False, what="the store name")
    if n == 3:
        return Route(ROUTE_STORE, store)
    if n == 4:
        action = percent_decode(segments[3], plus_is_space=False, what="the path")
        if action == "keys":
            return Route(ROUTE_KEYS, store)
        if action == "history":
            return Route(ROUTE_HISTORY, store)
        if action == "lookups":
            return Route(ROUTE_LOOKUPS, store)
        if action == "changes":
            return Route(ROUTE_CHANGES, store)
        if action == "rejected":
            return Route(ROUTE_REJECTED, store)
        return Route(ROUTE_BATCH_GET, store) if action == "keys:batchGet" else None
    if n == 5 and segments[3] == b"rejected":
        return Route(ROUTE_REJECTED_RECORD, store,
                     record=percent_decode(segments[4], plus_is_space=False, what="the record id"))
    if segments[3] != b"keys" or n not in (5, 6):
        return None
    if n == 6 and segments[5] != b"versions":
        return None
    key = percent_decode(segments[4], plus_is_space=False, what="the key")
    return Route(ROUTE_KEY if n == 5 else ROUTE_VERSIONS, store, key)


