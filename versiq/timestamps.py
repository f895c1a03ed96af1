"""The one timestamp grammar used by input files and query parameters (docs/contract.md, Timestamps).

A base-10 integer in ``[0, 2**63 - 1]`` is epoch milliseconds; otherwise the RFC 3339 profile
``YYYY-MM-DDTHH:MM:SS[.fraction](Z|+HH:MM|-HH:MM)`` is converted to epoch milliseconds with
sub-millisecond digits truncated. Anything else is an error that quotes the text.

Ingest and the HTTP API share this module so that a timestamp that loads is always a timestamp
that can be asked about, and vice versa.
"""

from __future__ import annotations

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
    if not (1 <= month <= 12 and 1 <= day <= _days_in_month(year, month)):
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
    seconds = _days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second
    millis = seconds * 1000 + int((fraction + "000")[:3]) - offset_minutes * 60_000
    if millis < 0 or millis > MAX_TIMESTAMP:
        raise TimestampError(f"{text!r} is outside the epoch-millisecond range [0, 2^63-1]")
    return millis


#: The instants (epoch ms) that SQL engines write as ``format_timestamp`` does: years 1 to 9999.
#: Spark's ``date_format`` writes year 0 as 0001 (its year of era) and years past 9999 with a
#: sign, and overflows past about year 294,000; the ingest's SQL writes the others as
#: ``format_timestamp`` writes those past 9999 (``ingest.semantics``, ``ingest.decisions_here``).
SQL_RFC3339_MS = (-62_135_596_800_000, 253_402_300_799_999)


def format_timestamp(millis: int) -> str:
    """Render epoch ms as an RFC 3339 UTC instant (for humans: logs, CLI summaries).

    Total over every stored timestamp: an instant past year 9999 (RFC 3339 has four year digits)
    is rendered as its epoch milliseconds, so a summary never fails on an extreme record.
    """
    days, rest = divmod(millis, 86_400_000)
    year, month, day = _civil_from_days(days)
    if not 0 <= year <= 9999:
        return f"{millis} ms since the epoch"
    hour, rest = divmod(rest, 3_600_000)
    minute, rest = divmod(rest, 60_000)
    second, milli = divmod(rest, 1000)
    return f"{year:04d}-{month:02d}-{day:02d}T{hour:02d}:{minute:02d}:{second:02d}.{milli:03d}Z"


def human_instant(millis: int) -> str:
    """An instant for a person who may also want to copy the number: ``2023-11-14T22:13:20.000Z
    (1700000000000)``, as problem details and CLI messages write times."""
    return f"{format_timestamp(millis)} ({millis})"


# Proleptic Gregorian calendar arithmetic (H. Hinnant's days_from_civil / civil_from_days). The
# standard library's calendar and datetime refuse year 0 and raise for instants outside their
# range; plain integer arithmetic is total, so every text of the grammar either converts or is a
# TimestampError, never another exception (a year-0 record once blocked a store).


def _is_leap(year: int) -> bool:
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)


def _days_in_month(year: int, month: int) -> int:
    if month == 2:
        return 29 if _is_leap(year) else 28
    return 30 if month in (4, 6, 9, 11) else 31


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days from 1970-01-01 to the given date (negative before it)."""
    year -= month <= 2
    era = year // 400
    year_of_era = year - era * 400
    day_of_year = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    return era * 146_097 + day_of_era - 719_468


def _civil_from_days(days: int) -> tuple[int, int, int]:
    """The date ``days`` after 1970-01-01: the inverse of ``_days_from_civil``."""
    days += 719_468
    era = days // 146_097
    day_of_era = days - era * 146_097
    year_of_era = (day_of_era - day_of_era // 1460 + day_of_era // 36_524 - day_of_era // 146_096) // 365
    day_of_year = day_of_era - (365 * year_of_era + year_of_era // 4 - year_of_era // 100)
    mp = (5 * day_of_year + 2) // 153
    day = day_of_year - (153 * mp + 2) // 5 + 1
    month = mp + (3 if mp < 10 else -9)
    return year_of_era + era * 400 + (month <= 2), month, day
