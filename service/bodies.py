"""Request bodies of the POST routes (``service.routes.POST_ROUTES``): bounded in size, in time
and in the memory all of them hold at once.

Read straight from the ASGI ``receive`` channel by the raw-path router:

- A body over ``MAX_BODY_BYTES`` is a 413 as soon as it is known to be (the declared
  Content-Length, or the bytes received so far), without reading the rest.
- The bodies being buffered by all requests of the process together stay within a
  ``BodyBudget`` (``MAX_BUFFERED_BODY_BYTES``): a request whose body would take more is a 503
  ``server-busy`` with ``Retry-After``, at once when its Content-Length says so. So a crowd of
  clients that each send most of a large body and then stall cannot hold more than that; the
  protocol's body timeout (``service.http``) cuts such a client off.
- A JSON body that is not ``application/json`` is a 415; one that does not parse, has a string
  with a lone surrogate (it cannot be a key: keys are UTF-8), or holds more objects than the
  route accepts is a 400. It is parsed in the thread pool, never on the event loop, and the
  object count is checked while it is parsed, so a body of a million objects is refused after
  the first ones over the limit rather than built whole.

Problems answered before a body was read to its end close the connection (``Connection:
close``): the rest of the body is not worth receiving.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.types import Receive, Scope

from versiq.service.problems import Problem, bad_request

#: 1,000 keys of the longest allowed key (4 KiB of UTF-8, JSON-escaped up to 6 bytes a byte)
#: fit; nothing a batch needs is larger.
MAX_BODY_BYTES = 32 * 1024 * 1024
#: Bytes of request bodies one server process buffers at once, over all requests: four bodies
#: of the largest size.
MAX_BUFFERED_BODY_BYTES = 4 * MAX_BODY_BYTES
#: Seconds a client refused for the budget is asked to wait (``Retry-After``).
BUSY_RETRY_AFTER_S = 1

_CLOSE = {"connection": "close"}
#: A ``\\u`` escape of a surrogate (D800-DFFF): the only way a JSON text can hold a lone one.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


def _too_large(size: int | str) -> Problem:
    return Problem("content-too-large", f"the request body ({size} bytes) is larger than the "
                   f"{MAX_BODY_BYTES} bytes a request may carry; split the batch", headers=dict(_CLOSE))


def media_type_of(scope: Scope) -> str:
    return (_header(scope, b"content-type") or "").split(";", 1)[0].strip().lower()


class BodyBudget:
    """The bytes of request bodies buffered at once by the requests of one process (a counter
    on the event loop, where every body is read: no lock)."""

    def __init__(self, limit: int = MAX_BUFFERED_BODY_BYTES) -> None:
        self.limit = limit
        self.used = 0

    def _busy(self, wanted: int) -> Problem:
        return Problem("server-busy", f"the server is buffering {self.used} bytes of request bodies and "
                       f"takes at most {self.limit} at once; this body ({wanted} bytes or more) does not fit "
                       f"now: retry in {BUSY_RETRY_AFTER_S} s",
                       headers={"retry-after": str(BUSY_RETRY_AFTER_S), **_CLOSE})

    def take(self, size: int) -> None:
        """Count ``size`` more bytes as buffered; ``Problem`` (503) if they do not fit."""
        if self.used + size > self.limit:
            raise self._busy(size)
        self.used += size

    def give_back(self, size: int) -> None:
        self.used -= size

    @asynccontextmanager
    async def read(self, scope: Scope, receive: Receive) -> AsyncIterator[bytes]:
        """The bytes of a POST request's body, at most ``MAX_BODY_BYTES`` (413 otherwise),
        counted against this budget until the block ends (503 when they do not fit)."""
        declared = _header(scope, b"content-length")
        if declared is not None and declared.isdigit():
            if int(declared) > MAX_BODY_BYTES:
                raise _too_large(declared)
            if self.used + int(declared) > self.limit:
                raise self._busy(int(declared))
        held = 0
        try:
            chunks: list[bytes] = []
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise bad_request("the client closed the connection before the request body was complete")
                chunk = message.get("body", b"")
                if held + len(chunk) > MAX_BODY_BYTES:
                    raise _too_large(f"more than {held + len(chunk)}")
                self.take(len(chunk))
                held += len(chunk)
                chunks.append(chunk)
                if not message.get("more_body", False):
                    break
            raw = b"".join(chunks)
            del chunks
            yield raw
        finally:
            self.give_back(held)


def require_json(scope: Scope) -> None:
    """415 unless the request says its body is ``application/json``."""
    media_type = media_type_of(scope)
    if media_type != "application/json":
        raise Problem("unsupported-media-type",
                      f"the request body must be application/json, not {media_type or 'missing'!r}")


async def parse_json_off_loop(raw: bytes, max_objects: int) -> Any:
    """``parse_json`` in the thread pool: a large body never holds up the event loop."""
    return await run_in_threadpool(parse_json, raw, max_objects)


class _TooManyObjects(Exception):
    pass


def _object_counter(max_objects: int) -> Any:
    count = 0

    def hook(obj: dict[str, Any]) -> dict[str, Any]:
        nonlocal count
        count += 1
        if count > max_objects:
            raise _TooManyObjects
        return obj

    return hook


def parse_json(raw: bytes, max_objects: int | None = None) -> Any:
    """A JSON request body of at most ``max_objects`` JSON objects (None: any number; checked
    while parsing); 400 with the reason otherwise, also for a string holding a lone surrogate."""
    if not raw:
        raise bad_request("the request body is empty; send a JSON object")
    hook = None if max_objects is None else _object_counter(max_objects)
    try:
        document = json.loads(raw.decode("utf-8"), object_hook=hook)
    except UnicodeDecodeError as exc:
        raise bad_request(f"the request body is not UTF-8: invalid byte at offset {exc.start}") from None
    except json.JSONDecodeError as exc:
        raise bad_request(f"the request body is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise bad_request("the request body is nested too deeply") from None
    except _TooManyObjects:
        raise bad_request(f"the request body holds more than {max_objects} JSON objects; "
                          "nothing this route accepts has that many") from None
    if _SURROGATE_ESCAPE.search(raw) is not None:
        _check_no_lone_surrogate(document)
    return document


def _check_no_lone_surrogate(document: Any) -> None:
    """400 when a string of ``document`` holds a surrogate that is not half of a pair (valid
    JSON, but no Unicode text: it cannot be a key, nor be written back as UTF-8)."""
    try:
        json.dumps(document, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(exc.object[exc.start])
        raise bad_request(f"the request body holds a lone surrogate (\\u{code:04x}) in a string: "
                          "strings must be Unicode text (escape non-BMP characters as surrogate pairs)") from None
