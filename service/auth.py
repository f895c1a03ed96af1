"""Bearer-token authentication: optional; on when ``VERSIQ_API_TOKENS`` (or the file) names tokens.

Every ``/v1`` operation and ``/metrics`` need ``Authorization: Bearer <token>``; ``/healthz``,
``/readyz`` (which then tells only whether the server is ready), ``/openapi.json`` and the pages
without data (the console, ``/docs``, ``/redoc``) stay open.
Tokens are compared in constant time.
"""

from __future__ import annotations

import hmac
from collections.abc import Collection

from starlette.types import Scope

from versiq.service.problems import Problem


def authorized(tokens: Collection[str] | None, scope: Scope) -> Problem | None:
    """None when the request may proceed, else the 401 problem to answer."""
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
