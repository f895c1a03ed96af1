"""The one timestamp grammar used by input files and query parameters (CONTRACT.md, Timestamps).

A base-10 integer in ``[0, 2**63 - 1]`` is epoch milliseconds; otherwise the RFC 3339 profile
``YYYY-MM-DDTHH:MM:SS[.fraction](Z|+HH:MM|-HH:MM)`` is converted to epoch milliseconds with
sub-millisecond digits truncated. Anything else is an error that quotes the text.

Ingest and the HTTP API share this module so that a timestamp that loads is always a timestamp
that can be asked about, and vice versa.
"""

from __future__ import annotations

import calendar
import re

MAX_TIMESTAMP = 2**63 - 1

_INTEGER = re.compile(r"[0-9]+\Z")
_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?"
    r"(?:([Zz])|([+-])(\d{2}):(\d{2}))\Z",
    re.ASCII,  # RFC 3339 digits are ASCII: no other Unicode decimal digits
)


class TimestampError(ValueError):
    """The text is not a timestamp in the accepted grammar; the message quotes it."""


def parse_timestamp(text: str, *, query_string: bool = False) -> int:
    """Parse ``text`` as epoch ms or an RFC 3339 instant with offset.

    ``query_string=True`` reads a space where the offset sign belongs as ``+``: a raw ``+`` in a
    URL query arrives form-decoded as a space, and users paste ISO instants unencoded.
    """
    if _INTEGER.match(text):
        digits = text.lstrip("0") or "0"
        # checked on the text first: int() refuses texts over 4300 digits
        value = int(digits) if len(digits) <= 19 else MAX_TIMESTAMP + 1
        if value > MAX_TIMESTAMP:
            raise TimestampError(f"timestamp {text!r} is above 2^63-1")
        return value
    candidate = text
    if query_string and len(text) > 6 and text[-6] == " ":
        candidate = text[:-6] + "+" + text[-5:]
    match = _RFC3339.match(candidate)
    if match is None:
        raise TimestampError(
            f"{text!r} is not a timestamp: expected epoch milliseconds (a non-negative integer) "
            "or an RFC 3339 instant with offset such as 2024-01-31T12:00:00Z"
        )
    year, month, day, hour, minute, second = (int(match.group(i)) for i in range(1, 7))
    fraction = match.group(7) or ""
    if not (1 <= month <= 12 and 1 <= day <= calendar.monthrange(year, month)[1]):
        raise TimestampError(f"{text!r} is not a valid calendar date")
    if hour > 23 or minute > 59 or second > 59:
        raise TimestampError(f"{text!r} has an out-of-range time of day")
    offset_minutes = 0
    if match.group(8) is None:
        off_h, off_m = int(match.group(10)), int(match.group(11))
        if off_h > 23 or off_m > 59:
            raise TimestampError(f"{text!r} has an out-of-range UTC offset")
        offset_minutes = off_h * 60 + off_m
        if match.group(9) == "-":
            offset_minutes = -offset_minutes
    seconds = calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0))
    millis = seconds * 1000 + int((fraction + "000")[:3]) - offset_minutes * 60_000
    if millis < 0 or millis > MAX_TIMESTAMP:
        raise TimestampError(f"{text!r} is outside the epoch-millisecond range [0, 2^63-1]")
    return millis


def format_timestamp(millis: int) -> str:
    """Render epoch ms as an RFC 3339 UTC instant (for humans: logs, CLI summaries)."""
    import datetime as _dt

    instant = _dt.datetime.fromtimestamp(millis / 1000, tz=_dt.UTC)
    return instant.strftime("%Y-%m-%dT%H:%M:%S.") + f"{millis % 1000:03d}Z"
