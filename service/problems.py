"""RFC 9457 problem details: every error the service returns is one of these types.

Each ``type`` is ``PROBLEM_BASE + <name>``; openapi.yaml documents every one of them.
"""

from __future__ import annotations

import json
from typing import Any

PROBLEM_BASE = "https://versiq.dev/problems/"
PROBLEM_MEDIA_TYPE = "application/problem+json"

#: name -> (status, title)
PROBLEM_TYPES: dict[str, tuple[int, str]] = {
    "bad-request": (400, "Bad request"),
    "unsupported-query": (400, "Unsupported query"),
    "unauthorized": (401, "Unauthorized"),
    "not-found": (404, "No version of the key at that time"),
    "expired": (404, "Older than the store's history retention"),
    "store-not-found": (404, "Store not found"),
    "stream-not-found": (404, "Stream not found"),
    "snapshot-not-found": (404, "Snapshot not found"),
    "record-not-found": (404, "Rejected record not found"),
    "route-not-found": (404, "No such resource"),
    "method-not-allowed": (405, "Method not allowed"),
    "not-acceptable": (406, "Not acceptable"),
    "request-timeout": (408, "Request timeout"),
    "gone": (410, "Gone"),
    "content-too-large": (413, "Content too large"),
    "unsupported-media-type": (415, "Unsupported media type"),
    "uri-too-long": (414, "URI too long"),
    "header-fields-too-large": (431, "Request header fields too large"),
    "internal-error": (500, "Internal server error"),
    "not-ready": (503, "Not ready"),
    "server-busy": (503, "Server busy"),
    "store-unavailable": (503, "Store unavailable"),
    "stream-unavailable": (503, "Stream unavailable"),
}


class Problem(Exception):
    """Raised anywhere in request handling; rendered as problem+json."""

    def __init__(self, name: str, detail: str, *, headers: dict[str, str] | None = None,
                 **extensions: Any) -> None:
        super().__init__(detail)
        self.name = name
        self.status, self.title = PROBLEM_TYPES[name]
        self.detail = detail
        self.headers = headers or {}
        self.extensions = extensions

    def payload(self) -> dict[str, Any]:
        """The problem object (also embedded per key in a ``keys:batchGet`` answer)."""
        payload: dict[str, Any] = {
            "type": PROBLEM_BASE + self.name,
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
        }
        payload.update(self.extensions)
        return payload

    def body(self) -> bytes:
        """The problem as UTF-8 JSON; a text that cannot be UTF-8 (a lone surrogate from a JSON
        request body, named in the detail) is written with ASCII escapes instead of failing."""
        payload = self.payload()
        try:
            return json.dumps(payload, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            return json.dumps(payload).encode("ascii")


def bad_request(detail: str, **extensions: Any) -> Problem:
    return Problem("bad-request", detail, **extensions)
