"""Raw-path routing and strict query-string parsing (docs/contract.md, HTTP request details).

Starlette routes on the percent-decoded path, which makes ``a%2Fb`` unreachable and lets
``foo%2Fversions`` hit the versions endpoint of ``foo``. The service therefore splits the raw
path on literal ``/`` and decodes each segment exactly once as UTF-8.
"""

from __future__ import annotations

import re

from versiq.service.problems import Problem, bad_request
from versiq.timestamps import TimestampError, parse_timestamp

_HEX = frozenset(b"0123456789abcdefABCDEF")
_UINT = re.compile(r"[0-9]+\Z")
MAX_INT64 = 2**63 - 1
MAX_PAGE_SIZE = 1000
DEFAULT_PAGE_SIZE = 100


def percent_decode(raw: bytes, *, plus_is_space: bool, what: str) -> str:
    """Decode ``%XX`` escapes once, then UTF-8 (strict). Invalid escapes/UTF-8 raise a 400."""
    if plus_is_space:
        raw = raw.replace(b"+", b" ")
    if b"%" not in raw:
        out = raw
    else:
        buf = bytearray()
        i, n = 0, len(raw)
        while i < n:
            c = raw[i]
            if c == 0x25:  # '%'
                if i + 2 < n and raw[i + 1] in _HEX and raw[i + 2] in _HEX:
                    buf.append(int(raw[i + 1:i + 3], 16))
                    i += 3
                    continue
                bad = raw[i:i + 3].decode("latin-1")
                raise bad_request(f"invalid percent-escape {bad!r} in {what}")
            buf.append(c)
            i += 1
        out = bytes(buf)
    try:
        return out.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad_request(f"{what} is not valid UTF-8 after percent-decoding: {exc.reason}") from None


def parse_query(query_string: bytes, allowed: tuple[str, ...]) -> dict[str, str]:
    """Form-decode a query string; unknown or repeated parameter names are a 400 naming them."""
    params: dict[str, str] = {}
    if not query_string:
        return params
    for part in query_string.split(b"&"):
        if not part:
            continue
        raw_name, _, raw_value = part.partition(b"=")
        name = percent_decode(raw_name, plus_is_space=True, what="a query parameter name")
        value = percent_decode(raw_value, plus_is_space=True, what=f"query parameter {name!r}")
        if name not in allowed:
            expected = ", ".join(allowed) if allowed else "none"
            raise bad_request(
                f"unknown query parameter {name!r} (names are case-sensitive; "
                f"this endpoint accepts: {expected})",
                parameter=name,
            )
        if name in params:
            raise bad_request(f"query parameter {name!r} is repeated", parameter=name)
        params[name] = value
    return params


def timestamp_param(params: dict[str, str], name: str) -> int | None:
    text = params.get(name)
    if text is None:
        return None
    try:
        return parse_timestamp(text, query_string=True)
    except TimestampError as exc:
        raise bad_request(f"query parameter {name!r}: {exc}", parameter=name) from None


def snapshot_param(params: dict[str, str], name: str = "snapshot") -> int | None:
    """A Delta version parameter (``snapshot``, ``minSnapshot``)."""
    text = params.get(name)
    if text is None:
        return None
    if not _UINT.match(text) or int(text) > MAX_INT64:
        raise bad_request(
            f"query parameter '{name}': {text!r} is not a Delta version "
            "(a non-negative integer)",
            parameter=name,
        )
    return int(text)


def page_size_param(params: dict[str, str]) -> int:
    text = params.get("pageSize")
    if text is None:
        return DEFAULT_PAGE_SIZE
    if not _UINT.match(text) or not 1 <= int(text) <= MAX_PAGE_SIZE:
        raise bad_request(
            f"query parameter 'pageSize': {text!r} is not an integer from 1 to {MAX_PAGE_SIZE} "
            "(larger values are refused, never clamped)",
            parameter="pageSize",
        )
    return int(text)


def order_param(params: dict[str, str]) -> str:
    text = params.get("order", "asc")
    if text not in ("asc", "desc"):
        raise bad_request(f"query parameter 'order': {text!r} is not 'asc' or 'desc'",
                          parameter="order")
    return text


def bool_param(params: dict[str, str], name: str) -> bool:
    """``true`` or ``false`` (default false); anything else is a 400 naming the parameter."""
    text = params.get(name)
    if text is None or text == "false":
        return False
    if text == "true":
        return True
    raise bad_request(f"query parameter {name!r}: {text!r} is not true or false", parameter=name)


__all__ = ["Problem", "parse_query", "percent_decode"]

