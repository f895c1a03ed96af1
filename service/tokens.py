"""Opaque, integrity-protected page tokens (CONTRACT.md, HTTP request details).

Format: ``base64url(payload JSON) "." base64url(HMAC-SHA256(secret, payload)[:16])``. The
payload binds the store, key, from, to, order, snapshot, the position (timestamp of the last
record returned) and the issue time. Clients must treat tokens as opaque.

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

from service.problems import Problem, bad_request

_VERSION = 1


@dataclass(frozen=True)
class PageQuery:
    store: str
    key: str
    from_time: int | None
    to_time: int | None
    order: str


@dataclass(frozen=True)
class PagePosition:
    query: PageQuery
    snapshot: int
    resume_after: int
    issued_at: float


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

    def issue(self, query: PageQuery, snapshot: int, resume_after: int,
              now: float | None = None) -> str:
        payload = json.dumps(
            [_VERSION, query.store, query.key, query.from_time, query.to_time, query.order,
             snapshot, resume_after, int((time.time() if now is None else now) * 1000)],
            ensure_ascii=False, separators=(",", ":"),
        ).encode("utf-8")
        return _b64(payload) + "." + _b64(self._mac(payload))

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
            data = json.loads(payload)
            (version, store, key, from_time, to_time, order, snapshot, resume_after,
             issued_ms) = data
        except (ValueError, TypeError):
            raise invalid from None
        if version != _VERSION:
            raise invalid
        bound = PageQuery(store, key, from_time, to_time, order)
        if bound != query:
            diffs = [
                name for name, a, b in (
                    ("store", bound.store, query.store), ("key", bound.key, query.key),
                    ("from", bound.from_time, query.from_time),
                    ("to", bound.to_time, query.to_time), ("order", bound.order, query.order),
                ) if a != b
            ]
            raise bad_request(
                "query parameter 'pageToken' belongs to another query: "
                + ", ".join(diffs)
                + " differ(s) from the request that issued it (repeat the same key, from, to "
                "and order; only pageSize may change)",
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
        return PagePosition(bound, snapshot, resume_after, issued_at)
