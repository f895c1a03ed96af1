"""History-retention durations: ``604800000`` (ms), ``500ms``/``30s``/``5m``/``12h``/``7d``/``2w``,
or ISO-8601 (``P7D``, ``PT12H``, ``P1DT2H30M``, ``PT0.5S``).

Months and years are refused: their length in milliseconds is not fixed, and a grace period
must be exact.
"""

from __future__ import annotations

import re

DEFAULT_HISTORY_RETENTION_MS = 86_400_000  # 1 day (docs/contract.md, Input edge cases)

_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_SHORT = re.compile(r"([0-9]+)(ms|s|m|h|d|w)\Z")
_ISO = re.compile(
    r"P(?:(?P<w>\d+)W)?(?:(?P<d>\d+)D)?"
    r"(?:T(?:(?P<h>\d+)H)?(?:(?P<m>\d+)M)?(?:(?P<s>\d+(?:\.\d{1,3})?)S)?)?\Z"
)


class DurationError(ValueError):
    """Not a duration in one of the accepted forms; the message quotes the text."""


def parse_duration_ms(text: str | int) -> int:
    """Return the duration in milliseconds (non-negative)."""
    if isinstance(text, bool):
        raise DurationError(f"{text!r} is not a duration")
    if isinstance(text, int):
        if text < 0:
            raise DurationError(f"duration {text} is negative")
        return text
    raw = text.strip()
    if raw.isdigit():
        return int(raw)
    short = _SHORT.match(raw)
    if short:
        return int(short.group(1)) * _UNITS[short.group(2)]
    iso = _ISO.match(raw.upper())
    if iso and raw.upper() not in ("P", "PT") and not raw.upper().endswith("T"):
        parts = iso.groupdict()
        total = 0
        for name, unit in (("w", "w"), ("d", "d"), ("h", "h"), ("m", "m")):
            if parts[name]:
                total += int(parts[name]) * _UNITS[unit]
        if parts["s"]:
            whole, _, frac = parts["s"].partition(".")
            total += int(whole) * 1000 + int((frac + "000")[:3])
        return total
    raise DurationError(
        f"{text!r} is not a duration: use milliseconds (604800000), a number with a unit "
        "(500ms, 30s, 5m, 12h, 7d, 2w) or ISO-8601 (P7D, PT12H)"
    )


def format_duration(millis: int) -> str:
    """A duration as a person writes it and ``parse_duration_ms`` reads it back: the largest unit
    that divides it exactly, weeks left out (``7d``, ``36h``, ``90m``, ``15s``, ``1500ms``)."""
    for unit in ("d", "h", "m", "s"):
        size = _UNITS[unit]
        if millis != 0 and millis % size == 0:
            return f"{millis // size}{unit}"
    return f"{millis}ms"
