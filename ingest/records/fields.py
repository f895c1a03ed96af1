"""The field rules of every format, in one place: what a key, a timestamp, a partition, an offset
and a value may be, and the reason code and detail of each rejection."""

from __future__ import annotations

from typing import Any

from versiq.ingest.records.jsonvalue import RawFloat, RawInt, compact, strict_loads
from versiq.timestamps import MAX_TIMESTAMP, TimestampError, parse_timestamp


class Reject(Exception):
    """A record-level rejection: ``reason`` is a code of ``versiq.layout.REJECT_REASONS``."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


MAX_INT64 = 2**63 - 1



def json_int(value: RawInt) -> int | None:
    """A JSON integer's value, or None when it is outside the signed 64-bit range (checked on
    the text first: ``int()`` refuses texts over 4300 digits)."""
    if len(value.lstrip("-")) > 19:
        return None
    number = int(value)
    return number if -MAX_INT64 - 1 <= number <= MAX_INT64 else None


def has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def safe_text(text: str | None) -> str | None:
    """Text that can be stored as UTF-8: lone surrogates (JSON escapes like \\ud800, or
    undecodable bytes kept by ``surrogateescape``) become U+FFFD."""
    if text is None or not has_surrogate(text):
        return text
    return "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in text)


# ------------------------------------------------------------------ field rules (all formats)
def key_from_json(value: Any, present: bool) -> str:
    if not present or value is None:
        raise Reject("missing_field", "missing field 'key'")
    if isinstance(value, RawInt):
        # JSON integer text is canonical (no leading zeros, no '+') except for "-0".
        return "0" if value == "-0" else str.__str__(value)
    if isinstance(value, RawFloat) or isinstance(value, (bool, dict, list)):
        raise Reject("bad_key", f"'key' must be a string or an integer, got {compact(value)}")
    if isinstance(value, str):
        if value == "":
            raise Reject("missing_field", "field 'key' is empty")
        return value
    raise Reject("bad_key", f"'key' has unsupported type {type(value).__name__}")


def timestamp_from_json(value: Any, present: bool) -> int:
    if not present or value is None:
        raise Reject("missing_field", "missing field 'timestamp'")
    if isinstance(value, RawInt):
        number = json_int(value)
        if number is None or number < 0 or number > MAX_TIMESTAMP:
            raise Reject("bad_timestamp", f"timestamp {value} is outside [0, 2^63-1]")
        return number
    if isinstance(value, str) and not isinstance(value, RawFloat):
        try:
            return parse_timestamp(value)
        except TimestampError as exc:
            raise Reject("bad_timestamp", str(exc)) from None
    raise Reject("bad_timestamp", f"'timestamp' must be epoch ms or an RFC 3339 instant, got {compact(value)}")


def optional_int(value: Any, name: str, reason: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, RawInt):
        number = json_int(value)
        if number is not None and number >= 0:
            return number
    raise Reject(reason, f"'{name}' must be a non-negative integer, got {compact(value)}")


def value_from_json_text(text: str) -> str:
    """A JSON-text value column (CSV, Parquet strings): parse strictly and re-render compactly.

    Text with no whitespace and no escapes is already its own compact form once it parses."""
    try:
        parsed = strict_loads(text)
        if " " not in text and "\\" not in text and "\t" not in text and "\n" not in text and "\r" not in text:
            return text
        return compact(parsed)
    except (ValueError, RecursionError) as exc:
        raise Reject("bad_value", f"'value' is not JSON text: {exc}") from None


# ------------------------------------------------------------------ batches

