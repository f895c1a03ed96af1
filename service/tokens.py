"""Opaque, integrity-protected page tokens (docs/contract.md, HTTP request details).

Format: ``base64url(payload JSON) "." base64url(HMAC-SHA256(secret, payload)[:16])``. The
payload binds the listing (a store's key versions, or a stream's records), the store or stream,
key, from, to, order, snapshot, the position of the last record returned (its timestamp for
versions; its ``(run, sequence)`` for stream records) and the issue time. Clients must treat
tokens as opaque.

The HMAC secret comes from ``VERSIQ_TOKEN_SECRET``; without it each process draws a random
one, so every worker/replica behind one address must share the variable (``versiq serve
--workers N`` sets one for its own workers when it is unset).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from dataclasses import dataclass

from versiq.service.problems import Problem, bad_request

#: Payload layouts: 1 = versions ``[1, store, key, from, to, order, snapshot, timestamp,
#: issued(, 1 when includeDeleted)]``; 2 = any listing ``[2, listing, name, key, from, to, order,
#: snapshot, [position...], issued]``.
_VERSION = 1
_VERSION_LISTING = 2
VERSIONS = "versions"
STREAM_RECORDS = "stream-records"
#: A store's key listing: ``key`` binds the listing's parameters (JSON text of prefix, start, end,
#: includeDeleted), ``from_time`` its asOf; the position is the last key returned.
KEYS = "keys"
#: A store's change feed: ``from_time``/``to_time`` bind sinceSnapshot/untilSnapshot; the position
#: is the last change returned, ``(snapshot, key, validFrom)``.
CHANGES = "changes"
#: A store's rejected records: ``key`` binds the reason filter (None: all); the position is the
#: ordinal of the last record returned (``query.rejected``).
REJECTED = "rejected"
_NAME_LABEL = {VERSIONS: "store", STREAM_RECORDS: "stream", KEYS: "store", CHANGES: "store", REJECTED: "store"}


@dataclass(frozen=True)
class PageQuery:
    """What a token binds: ``store`` is the store (versions) or the stream (stream records);
    ``key`` None = no key filter (stream records only)."""

    store: str
    key: str | None
    from_time: int | None
    to_time: int | None
    order: str
    listing: str = VERSIONS
    #: Versions only: tombstones are part of the listing (``includeDeleted``).
    include_deleted: bool = False


@dataclass(frozen=True)
class PagePosition:
    query: PageQuery
    snapshot: int
    #: The position of the last record returned: ``(timestamp,)`` for versions,
    #: ``(run, sequence)`` for stream records, ``(key,)`` for key listings.
    position: tuple[int | str, ...]
    issued_at: float

    @property
    def resume_after(self) -> int:
        """The timestamp of the last version returned (versions listings)."""
        value = self.position[0]
        assert isinstance(value, int)
        return value


def _position_ok(listing: str, position: list[object]) -> bool:
    if listing == KEYS:
        return all(isinstance(p, str) for p in position)
    if listing == CHANGES:
        return len(position) == 3 and _is_int(position[0]) and isinstance(position[1], str) and _is_int(position[2])
    return all(_is_int(p) for p in position)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _opt_int(value: object) -> bool:
    return value is None or _is_int(value)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class PageTokens:
    def __init__(self, secret: bytes, ttl_s: float) -> None:
        self._secret = secret
        self.ttl_s = ttl_s

    def _mac(self, payload: bytes) -> bytes:
        return hmac.new(self._secret, payload, hashlib.sha256).digest()[:16]

    def issue(self, query: PageQuery, snapshot: int, resume_after: int | tuple[int | str, ...],
              now: float | None = None) -> str:
        issued = int((time.time() if now is None else now) * 1000)
        position = (resume_after,) if isinstance(resume_after, int) else tuple(resume_after)
        data: list[object]
        if query.listing == VERSIONS:
            if query.key is None or len(position) != 1:
                raise ValueError("a versions token needs a key and one timestamp")
            data = [_VERSION, query.store, query.key, query.from_time, query.to_time, query.order,
                    snapshot, position[0], issued, *([1] if query.include_deleted else [])]
        else:
            data = [_VERSION_LISTING, query.listing, query.store, query.key, query.from_time,
                    query.to_time, query.order, snapshot, list(position), issued]
        payload = json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        return _b64(payload) + "." + _b64(self._mac(payload))

    @staticmethod
    def _decode(data: object) -> tuple[PageQuery, int, tuple[int | str, ...], int] | None:
        """The bound query, snapshot, position and issue time (ms) of a payload; None if malformed."""
        if not isinstance(data, list) or not data:
            return None
        include_deleted = False
        if data[0] == _VERSION and len(data) in (9, 10):
            _, name, key, from_time, to_time, order, snapshot, resume_after, issued_ms = data[:9]
            listing, position = VERSIONS, [resume_after]
            if len(data) == 10:
                if data[9] != 1:
                    return None
                include_deleted = True
        elif data[0] == _VERSION_LISTING and len(data) == 10:
            _, listing, name, key, from_time, to_time, order, snapshot, position, issued_ms = data
            if listing not in _NAME_LABEL or not isinstance(position, list):
                return None
        else:
            return None
        if not (isinstance(name, str) and (key is None or isinstance(key, str)) and _opt_int(from_time)
                and _opt_int(to_time) and isinstance(order, str) and _is_int(snapshot)
                and _is_int(issued_ms) and position
                and _position_ok(listing, position)):
            return None
        return (PageQuery(name, key, from_time, to_time, order, listing, include_deleted), snapshot,
                tuple(position), issued_ms)

    def resolve(self, token: str, query: PageQuery, now: float | None = None) -> PagePosition:
        """Check a token against the follow-up request; 400 on mismatch/tamper, 410 if expired."""
        invalid = bad_request(
            "query parameter 'pageToken' is not a valid page token (tampered, truncated or "
            "issued by another server secret); start again without it",
            parameter="pageToken",
        )
        head, dot, tail = token.partition(".")
        if not dot:
            raise invalid
        try:
            payload = _unb64(head)
            mac = _unb64(tail)
        except (binascii.Error, ValueError):
            raise invalid from None
        if not hmac.compare_digest(mac, self._mac(payload)):
            raise invalid
        try:
            decoded = self._decode(json.loads(payload))
        except (ValueError, TypeError):
            raise invalid from None
        if decoded is None:
            raise invalid
        bound, snapshot, position, issued_ms = decoded
        if bound != query:
            if bound.listing == query.listing == KEYS:
                raise bad_request(
                    "query parameter 'pageToken' belongs to another key listing: repeat the same "
                    "store, prefix, start, end, asOf and includeDeleted (only pageSize may change)",
                    parameter="pageToken",
                )
            if bound.listing != query.listing:
                raise bad_request(
                    "query parameter 'pageToken' belongs to another kind of listing (a "
                    f"{_NAME_LABEL[bound.listing]}'s {bound.listing}, not a "
                    f"{_NAME_LABEL[query.listing]}'s {query.listing}); start again without it",
                    parameter="pageToken",
                )
            diffs = [
                name for name, a, b in (
                    (_NAME_LABEL[query.listing], bound.store, query.store), ("key", bound.key, query.key),
                    ("from", bound.from_time, query.from_time),
                    ("to", bound.to_time, query.to_time), ("order", bound.order, query.order),
                    ("includeDeleted", bound.include_deleted, query.include_deleted),
                ) if a != b
            ]
            raise bad_request(
                "query parameter 'pageToken' belongs to another query: "
                + ", ".join(diffs)
                + " differ(s) from the request that issued it (repeat the same key, from, to, "
                "order and includeDeleted; only pageSize may change)",
                parameter="pageToken",
            )
        issued_at = issued_ms / 1000
        age = (time.time() if now is None else now) - issued_at
        if age > self.ttl_s:
            raise Problem(
                "gone",
                f"the page token expired: it was issued {age:.0f} s ago and tokens live "
                f"{self.ttl_s:g} s; start the listing again without pageToken",
            )
        return PagePosition(bound, snapshot, position, issued_at)
