"""Request bodies of the POST routes (``service.routes.POST_ROUTES``): JSON only, bounded.

Read straight from the ASGI ``receive`` channel by the raw-path router. A body over
``MAX_BODY_BYTES`` is a 413 as soon as it is known to be (the declared Content-Length, or the
bytes received so far), without reading the rest; a body that is not ``application/json`` is a
415 and one that does not parse a 400, each a problem with a precise detail.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.types import Receive, Scope

from versiq.service.problems import Problem, bad_request

#: 1,000 keys of the longest allowed key (4 KiB of UTF-8, JSON-escaped up to 6 bytes a byte)
#: fit; nothing a batch needs is larger.
MAX_BODY_BYTES = 32 * 1024 * 1024


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


def _too_large(size: int | str) -> Problem:
    return Problem("content-too-large", f"the request body ({size} bytes) is larger than the "
                   f"{MAX_BODY_BYTES} bytes a request may carry; split the batch")


def media_type_of(scope: Scope) -> str:
    return (_header(scope, b"content-type") or "").split(";", 1)[0].strip().lower()


async def read_json_body(scope: Scope, receive: Receive) -> Any:
    """The parsed JSON body of a POST request; raises a ``Problem`` otherwise."""
    media_type = media_type_of(scope)
    if media_type != "application/json":
        raise Problem("unsupported-media-type",
                      f"the request body must be application/json, not {media_type or 'missing'!r}")
    return parse_json(await read_body(scope, receive))


async def read_body(scope: Scope, receive: Receive) -> bytes:
    """The bytes of a POST request's body, at most ``MAX_BODY_BYTES`` (413 otherwise)."""
    declared = _header(scope, b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise _too_large(declared)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise bad_request("the client closed the connection before the request body was complete")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise _too_large(f"more than {size}")
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def parse_json(raw: bytes) -> Any:
    """A JSON request body; 400 with the reason otherwise."""
    if not raw:
        raise bad_request("the request body is empty; send a JSON object")
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise bad_request(f"the request body is not UTF-8: invalid byte at offset {exc.start}") from None
    except json.JSONDecodeError as exc:
        raise bad_request(f"the request body is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise bad_request("the request body is nested too deeply") from None
