"""The strict JSON codec of record values (docs/contract.md, Record parsing): the standard library's
parser with hooks that reject duplicate member names and NaN/Infinity and keep every number's text
verbatim, and ``compact``, the stored text of a value (member order and number text kept).

Spark's JSON reader accepts trailing garbage and coerces types, so it cannot decide this."""

from __future__ import annotations

import json
from typing import Any


class RawInt(str):
    """A JSON integer, kept as its source text."""


class RawFloat(str):
    """A JSON number with a fraction or exponent, kept as its source text."""


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        for name, _ in pairs:
            if name in seen:
                raise ValueError(f"duplicate member name {name!r}")
            seen.add(name)
    return result


_DECODER = json.JSONDecoder(
    object_pairs_hook=_pairs, parse_int=RawInt, parse_float=RawFloat, parse_constant=_no_constants
)


def strict_loads(text: str) -> Any:
    """RFC 8259 parse: whitespace only after the value, no duplicates, no NaN; ValueError else."""
    return _DECODER.decode(text)


def compact_scalar(value: Any) -> str:
    if isinstance(value, (RawInt, RawFloat)):
        return str.__str__(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, (int, float)):  # from Parquet values, not from JSON text
        return json.dumps(value)
    raise TypeError(f"unsupported value type {type(value).__name__}")


class _Text(str):
    """Already-rendered output text on ``compact``'s work stack."""


def compact(value: Any) -> str:
    """Compact JSON text keeping member order and each number's text verbatim.

    Iterative, so any value the (C) parser accepted renders, however deeply it is nested."""
    out: list[str] = []
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, _Text):
            out.append(item)
        elif isinstance(item, dict):
            parts: list[Any] = [_Text("{")]
            for i, (name, member) in enumerate(item.items()):
                parts += [_Text(("," if i else "") + json.dumps(name, ensure_ascii=False) + ":"), member]
            parts.append(_Text("}"))
            stack.extend(reversed(parts))
        elif isinstance(item, list):
            parts = [_Text("[")]
            for i, element in enumerate(item):
                if i:
                    parts.append(_Text(","))
                parts.append(element)
            parts.append(_Text("]"))
            stack.extend(reversed(parts))
        else:
            out.append(compact_scalar(item))
    return "".join(out)

