"""The HTTP/1.1 connection protocol ``versiq serve`` runs under uvicorn: uvicorn's httptools
protocol with three things uvicorn does not do:

- **Slow or idle clients are timed out.** uvicorn times out a connection only between two
  requests (``timeout_keep_alive``); a client that opens a connection and never finishes its
  request head holds it forever, and 1,000 of them were seen holding a server. Here the head
  of every request (from the connection's opening, or from the first byte of a later request,
  to the end of its headers) must arrive within ``VERSIQ_REQUEST_HEAD_TIMEOUT`` (default 10 s);
  otherwise the connection is closed, with a 408 problem when part of a request had arrived.
- **Slow request bodies are timed out too.** The body of a request (from the end of its head to
  its last byte) must arrive within ``VERSIQ_REQUEST_BODY_TIMEOUT`` (default 60 s: 32 MiB at
  about 0.5 MB/s); otherwise the connection is closed, with a 408 problem unless the answer
  has begun. A client that sends a head and part of a body, then stalls, would otherwise hold
  its connection, and what the handler buffered of the body, for ever.
- **Request size limits answer problem+json.** A request line longer than ``MAX_URL_BYTES``
  is a 414, headers larger than ``MAX_HEADER_BYTES`` in total a 431, both well above what the
  largest key (4 KiB of UTF-8, percent-encoded, plus a page token that repeats it) needs.
- **A malformed request is a 400 problem+json**, never uvicorn's plain-text body.

Every other behaviour is uvicorn's (keep-alive, pipelining, flow control, lifespan).
"""

from __future__ import annotations

import json
from asyncio import TimerHandle
from collections.abc import Mapping
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from versiq import settings
from versiq.service.problems import PROBLEM_BASE, PROBLEM_MEDIA_TYPE, PROBLEM_TYPES

#: Longest request target (path and query string) accepted, in bytes.
MAX_URL_BYTES = 64 * 1024
#: Largest total size of the header names and values of one request, in bytes.
MAX_HEADER_BYTES = 64 * 1024

_REASONS = {400: b"Bad Request", 408: b"Request Timeout", 414: b"URI Too Long",
            431: b"Request Header Fields Too Large"}


def head_timeout_s(env: Mapping[str, str] | None = None) -> float:
    """The configured head timeout in seconds; raises ``SettingError`` for a bad value."""
    return settings.REQUEST_HEAD_TIMEOUT.value(env)


def body_timeout_s(env: Mapping[str, str] | None = None) -> float:
    """The configured body timeout in seconds; raises ``SettingError`` for a bad value."""
    return settings.REQUEST_BODY_TIMEOUT.value(env)


class _Refused(Exception):
    """Raised inside a parser callback to stop parsing a request that is over a limit."""


class VersiqHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with head and body timeouts, size limits and problem+json
    refusals."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timeout_s = head_timeout_s()
        self._head_timer: TimerHandle | None = None
        self._body_timeout_s = body_timeout_s()
        self._body_timer: TimerHandle | None = None
        self._head_bytes_seen = False
        self._url_bytes = 0
        self._header_bytes = 0
        self._refusal: tuple[int, str, str] | None = None

    # ------------------------------------------------------------------ head timeout
    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self._head_timeout_s, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self._head_bytes_seen:
            self._refuse(408, "request-timeout",
                         f"the request head did not arrive within {self._head_timeout_s:g} s")
        else:  # an idle connection: nothing to answer
            self.transport.close()

    # ------------------------------------------------------------------ body timeout
    def _cancel_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _body_timed_out(self) -> None:
        """The body did not arrive in time: 408 unless the answer has begun (then only close:
        the handler sees a disconnect and lets go of what it buffered)."""
        self._body_timer = None
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_started:
            self._refuse(408, "request-timeout",
                         f"the request body did not arrive within {self._body_timeout_s:g} s")
        else:
            self.transport.close()

    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        self._cancel_body_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if data:
            self._head_bytes_seen = True
            if self.cycle is None or self.cycle.response_complete:
                self._arm_head_timer()  # a request (or the next one on this connection) begins
        super().data_received(data)

    # ------------------------------------------------------------------ parser callbacks
    def on_message_begin(self) -> None:
        self._url_bytes = 0
        self._header_bytes = 0
        self._arm_head_timer()
        super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        self._url_bytes += len(url)
        if self._url_bytes > MAX_URL_BYTES:
            self._refusal = (414, "uri-too-long", f"the request target is longer than {MAX_URL_BYTES} bytes")
            raise _Refused
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value)
        if self._header_bytes > MAX_HEADER_BYTES:
            self._refusal = (431, "header-fields-too-large",
                             f"the request headers are larger than {MAX_HEADER_BYTES} bytes in total")
            raise _Refused
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._cancel_head_timer()
        self._head_bytes_seen = False
        self._cancel_body_timer()
        self._body_timer = self.loop.call_later(self._body_timeout_s, self._body_timed_out)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._cancel_body_timer()
        super().on_message_complete()

    # ------------------------------------------------------------------ refusals
    def send_400_response(self, msg: str) -> None:
        """uvicorn calls this for any request the parser refuses (and for a callback that raised
        ``_Refused``): answer problem+json instead of plain text."""
        status, name, detail = self._refusal or (400, "bad-request", f"malformed HTTP request: {msg}")
        self._refuse(status, name, detail)

    def _refuse(self, status: int, name: str, detail: str) -> None:
        self._cancel_head_timer()
        self._cancel_body_timer()
        title = PROBLEM_TYPES[name][1]
        body = json.dumps({"type": PROBLEM_BASE + name, "title": title, "status": status,
                           "detail": detail}).encode("utf-8")
        head = [b"HTTP/1.1 %d %s\r\n" % (status, _REASONS[status])]
        for header, value in self.server_state.default_headers:
            head.append(header + b": " + value + b"\r\n")
        head.append(b"content-type: " + PROBLEM_MEDIA_TYPE.encode("ascii") + b"\r\n")
        head.append(b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body))
        self.transport.write(b"".join(head) + body)
        self.transport.close()
