"""Floating-point numbers of decoded Kafka values as JSON (docs/contract.md, Kafka sources): the one
rule the Avro (``records.registry``) and Protobuf (``records.protobuf``) mappings share.

A 32-bit float is the shortest decimal that reads back as the same 32-bit float (``0.1f`` is
``0.1``, as Java's ``Float.toString`` and ProtoJSON write it), not the 17 digits of the double
that holds it (``0.10000000149011612``); a 64-bit double is itself (Python's ``repr`` and orjson
already write the shortest text of a double). NaN and the infinities, which JSON has no numbers
for, are the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``.
"""

from __future__ import annotations

import math
import struct

_FLOAT32 = struct.Struct("<f")


def _to_float32(value: float) -> float:
    """``value`` rounded to the nearest 32-bit float (an infinity beyond the largest one)."""
    try:
        result: float = _FLOAT32.unpack(_FLOAT32.pack(value))[0]
    except OverflowError:  # struct refuses what IEEE 754 rounds to an infinity
        return math.copysign(math.inf, value)
    return result


def shortest_float32(value: float) -> float:
    """The double whose shortest text is the shortest decimal that reads back as the 32-bit float
    ``value`` holds (``value`` is first rounded to 32 bits; one beyond the 32-bit range, NaN and
    the infinities are returned unchanged). At most 9 significant digits, the fewest that do."""
    if not math.isfinite(value):
        return value
    single = _to_float32(value)
    if not math.isfinite(single):  # a double beyond the 32-bit range: not a 32-bit float's value
        return value
    for digits in range(1, 10):  # 9 digits always read back (the IEEE 754 bound for binary32)
        candidate = float(f"{single:.{digits}g}")
        if _to_float32(candidate) == single:
            return candidate
    return single


def json_float(value: float, *, float32: bool = False) -> float | str:
    """``value`` as JSON: a number (``shortest_float32`` of it when ``float32``), or ``"NaN"``,
    ``"Infinity"``, ``"-Infinity"``."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return shortest_float32(value) if float32 else value
