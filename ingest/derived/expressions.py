"""The small expression language of derived tables (docs/derived-tables.md, "Expressions").

One parser and one evaluator serve both the record-at-a-time topology and the reference model,
so the two can never disagree about what an expression means. Grammar (precedence low to high):

    expr       := or
    or         := and ("or" and)*
    and        := not ("and" not)*
    not        := "not" not | comparison
    comparison := additive [ ("=" | "==" | "!=" | "<>" | "<" | "<=" | ">" | ">=") additive
                           | "is" ["not"] "null" ]
    additive   := term (("+" | "-") term)*
    term       := unary (("*" | "/" | "%") unary)*
    unary      := "-" unary | primary
    primary    := NUMBER | STRING | "true" | "false" | "null" | "key"
                | ("value" | "agg") ("." NAME | "[" INTEGER "]" | "[" STRING "]")*
                | FUNCTION "(" expr ("," expr)* ")" | "(" expr ")"

``agg`` is the current aggregate; only a custom aggregate's ``add``/``subtract`` (and a
``reduce``'s) may use it (``Expression.uses_agg``; the pipeline loader checks where).
``+`` adds two numbers or concatenates two strings (anything else is null); ``%`` is the
remainder of truncated division (its sign is the dividend's, as in Java, SQL and Spark).
Functions: ``coalesce(a, ...)``, ``lower(s)``, ``upper(s)``, ``concat(a, ...)`` (strings,
numbers and booleans as their JSON text; null if any argument is null, an object or an array),
``substring(s, start[, length])`` (1-based, in code points, clamped to the string),
``length(s)`` (code points), ``int(x)`` (a number or numeric string truncated toward zero),
``floor(x)`` (the largest integer not above it) and ``decimal(x)`` (a number or numeric string
as a number).

Keywords and function names are case-insensitive; member names after ``.`` are not (they are
JSON member names). Evaluation never raises: anything that fails (a missing member, a wrong
type, division by zero, comparing a string with a number) is null, because a pipeline run must
never crash on one odd record (docs/contract.md: ``try_`` semantics).

Numbers are ``int`` or ``decimal.Decimal``, never ``float``: values are parsed with
``parse_float=Decimal`` and computed numbers are rendered as plain decimals, so a sum of prices
is exact and renders the same on every machine. ``+ - *`` are exact (integers without limit,
decimals up to 1000 significant digits); ``/`` rounds to 34 significant digits. A number whose
magnitude is 1E+1001 or more, or non-zero below 1E-1000, is out of range and reads as null:
plain rendering has no exponent, so such a number would render unboundedly long.
"""

from __future__ import annotations

import decimal
import json
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

__all__ = [
    "Expression",
    "ExpressionError",
    "is_true",
    "key_string",
    "parse_expression",
    "parse_value",
    "render_json",
    "render_number",
]


class ExpressionError(ValueError):
    """An expression that does not parse; the message quotes the text and names the column."""


# --------------------------------------------------------------------------------------------
# Values: JSON text <-> Python, number rendering
# --------------------------------------------------------------------------------------------


def _reject_constant(name: str) -> Any:
    """``NaN``/``Infinity`` are not JSON; accepting them would put non-numbers into arithmetic."""
    raise ValueError(f"{name} is not valid JSON")


def parse_value(text: str | None) -> Any:
    """Parse a record value (JSON text) into Python; ``None`` (a tombstone) stays ``None``.

    Non-integral numbers become ``Decimal`` (never ``float``) so arithmetic and rendering are
    exact; integers stay ``int``. Invalid JSON raises ``ValueError`` (``json.JSONDecodeError``).
    """
    if text is None:
        return None
    if text.__class__ is str:
        # the decoder's scanner alone, when the text is one JSON value and nothing around it;
        # anything else (blanks around it, extra data, a BOM, no value) goes through json.loads
        try:
            parsed, end = _SCAN(text, 0)
        except StopIteration:
            pass
        else:
            if end == len(text):
                return parsed
    return json.loads(text, parse_float=Decimal, parse_constant=_reject_constant)


_SCAN: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder(  # type: ignore[attr-defined]
    parse_float=Decimal, parse_constant=_reject_constant).scan_once


def render_number(n: int | Decimal) -> str:
    """Render a number as JSON text: an integer when integral, else a plain decimal.

    No exponent and no trailing zeros (``Decimal("1E+2")`` -> ``100``, ``Decimal("0.10")`` ->
    ``0.1``, ``Decimal("-0")`` -> ``0``), so equal numbers always render identically whatever
    their scale was in the input. Done on the digit tuple rather than with ``normalize()``,
    which would round to the ambient context's precision.
    """
    if isinstance(n, bool):
        raise TypeError(f"{n!r} is a boolean, not a number")
    if isinstance(n, int):
        try:
            return str(n)
        except ValueError:  # beyond Python's int->str digit limit: go through Decimal
            n = Decimal(n)
    elif isinstance(n, float):
        n = Decimal(str(n))
    if not isinstance(n, Decimal):
        raise TypeError(f"{n!r} is not a number")
    if not n.is_finite():
        raise ValueError(f"{n} is not a finite number")
    sign, digits, exponent = n.as_tuple()
    assert isinstance(exponent, int)  # finite, checked above
    coefficient = "".join(map(str, digits)).lstrip("0")
    if not coefficient:
        return "0"
    if exponent < 0:
        drop = min(len(coefficient) - len(coefficient.rstrip("0")), -exponent)
        if drop:
            coefficient = coefficient[:-drop]
            exponent += drop
    if exponent >= 0:
        text = coefficient + "0" * exponent
    else:
        point = len(coefficient) + exponent
        if point > 0:
            text = coefficient[:point] + "." + coefficient[point:]
        else:
            text = "0." + "0" * -point + coefficient
    return "-" + text if sign else text


#: ``json.dumps(s, ensure_ascii=False)`` for a string, without building an encoder per call.
_render_string: Callable[[str], str] = json.encoder.encode_basestring  # type: ignore[attr-defined]


def render_json(value: Any) -> str:
    """Render a Python value (as from ``parse_value`` or ``Expression.evaluate``) as compact JSON.

    Member order is kept, strings are not ASCII-escaped, and numbers go through
    ``render_number``: rendering *normalises* numbers (``1.50`` -> ``1.5``, ``1E+2`` -> ``100``),
    it does not reproduce the input's spelling. Values that must stay verbatim (join results)
    are built from the original text instead (docs/derived-tables.md, "Values").
    """
    cls = value.__class__
    if cls is str:
        return _render_string(value)
    if cls is int:
        return render_number(value)
    if cls is dict:
        return "{" + ",".join([_render_member(name, member) for name, member in value.items()]) + "}"
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, (int, Decimal)):
        return render_number(value)
    if isinstance(value, float):
        return render_number(Decimal(str(value)))
    if isinstance(value, str):
        return _render_string(value)
    if isinstance(value, dict):
        return "{" + ",".join([_render_member(name, member) for name, member in value.items()]) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(render_json(item) for item in value) + "]"
    raise TypeError(f"{type(value).__name__} is not a JSON value")


def _render_member(name: Any, member: Any) -> str:
    if not isinstance(name, str):
        raise TypeError(f"object member names must be strings, not {name!r}")
    return _render_string(name) + ":" + render_json(member)


#: Numbers the evaluator works with have a magnitude below 1E+1001 and, unless zero, of at least
#: 1E-1000. Beyond that a number is "out of range" and evaluates to null (like a Spark decimal
#: overflow under try_ semantics): its plain rendering, which never uses an exponent, would
#: otherwise be unbounded (1E+999999999 is valid JSON and would render as a billion digits).
_MAX_ADJUSTED = 1000
_INT_LIMIT = 10 ** (_MAX_ADJUSTED + 1)


def _in_range(n: int | Decimal) -> bool:
    if isinstance(n, int):
        return -_INT_LIMIT < n < _INT_LIMIT
    return n.is_finite() and (not n or -_MAX_ADJUSTED <= n.adjusted() <= _MAX_ADJUSTED)


def key_string(result: Any) -> str | None:
    """Turn a group-key or foreign-key result into a record key.

    A string is used as is; any other JSON value becomes its compact JSON text (``1`` -> ``"1"``,
    ``true`` -> ``"true"``); null means "no key" (the record is dropped / has no partner).
    """
    if result is None:
        return None
    if isinstance(result, str):
        return result
    return render_json(result)


def is_true(result: Any) -> bool:
    """Filter predicate: only the boolean ``true`` passes; null or any other value counts as false."""
    return result is True


# --------------------------------------------------------------------------------------------
# Syntax tree
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Literal:
    value: Any  # int, Decimal, str, bool or None


@dataclass(frozen=True, slots=True)
class _Key:
    pass


@dataclass(frozen=True, slots=True)
class _Path:
    steps: tuple[str | int, ...]  # () is ``value`` itself; str = member, int = array index


@dataclass(frozen=True, slots=True)
class _Agg:
    steps: tuple[str | int, ...]  # a path into the current aggregate (``agg``)


@dataclass(frozen=True, slots=True)
class _Negate:
    operand: _Node


@dataclass(frozen=True, slots=True)
class _Not:
    operand: _Node


@dataclass(frozen=True, slots=True)
class _Arithmetic:
    op: str  # + - * / %
    left: _Node
    right: _Node


@dataclass(frozen=True, slots=True)
class _Compare:
    op: str  # = != < <= > >= (aliases already folded)
    left: _Node
    right: _Node


@dataclass(frozen=True, slots=True)
class _And:
    left: _Node
    right: _Node


@dataclass(frozen=True, slots=True)
class _Or:
    left: _Node
    right: _Node


@dataclass(frozen=True, slots=True)
class _IsNull:
    operand: _Node
    negated: bool


@dataclass(frozen=True, slots=True)
class _Call:
    function: str  # lower-case name
    args: tuple[_Node, ...]


_Node = _Literal | _Key | _Path | _Agg | _Negate | _Not | _Arithmetic | _Compare | _And | _Or | _IsNull | _Call


def _children(node: _Node) -> tuple[_Node, ...]:
    match node:
        case _Negate(operand) | _Not(operand) | _IsNull(operand, _):
            return (operand,)
        case _Arithmetic(_, left, right) | _Compare(_, left, right) | _And(left, right) | _Or(left, right):
            return (left, right)
        case _Call(_, args):
            return args
    return ()


def _depth(root: _Node) -> int:
    """Tree depth, computed without recursion (the tree may be deeper than is safe to recurse)."""
    deepest = 0
    stack = [(root, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in _children(node))
    return deepest


# --------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str  # "number", "string", "name", "op" or "end"
    text: str  # source text (op: the operator; end: "")
    pos: int  # 0-based offset in the expression text
    value: Any = None  # number: int/Decimal; string: the unescaped text


_OPERATORS = ("==", "!=", "<>", "<=", ">=", "=", "<", ">", "+", "-", "*", "/", "%", "(", ")", "[", "]", ",", ".")
_ESCAPES = {"\\": "\\", "'": "'", '"': '"', "n": "\n", "t": "\t", "r": "\r"}
_IDENT_START = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_")
_IDENT_CHARS = _IDENT_START | frozenset("0123456789")
_DIGITS = frozenset("0123456789")
_HEX = frozenset("0123456789abcdefABCDEF")
_MAX_LITERAL_DIGITS = 4000  # below Python's int<->str conversion limit


def _fail(message: str, text: str, pos: int, hint: str = "") -> ExpressionError:
    """``<message> at column <1-based> in '<text>'[: <hint>]``: the column points at the culprit."""
    return ExpressionError(f"{message} at column {pos + 1} in {text!r}" + (f": {hint}" if hint else ""))


def _describe(token: _Token) -> str:
    return "end of expression" if token.kind == "end" else repr(token.text)


def _read_string(text: str, start: int) -> tuple[str, int]:
    """Read a quoted string starting at ``start`` (the quote); return (value, end offset)."""
    quote = text[start]
    out: list[str] = []
    i = start + 1
    while i < len(text):
        ch = text[i]
        if ch == quote:
            return "".join(out), i + 1
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        if i + 1 >= len(text):
            break
        esc = text[i + 1]
        if esc in _ESCAPES:
            out.append(_ESCAPES[esc])
            i += 2
            continue
        if esc != "u":
            raise _fail(f"unknown escape '\\{esc}'", text, i)
        code, i = _read_hex4(text, i)
        if 0xD800 <= code <= 0xDBFF and text.startswith("\\u", i):
            low, after = _read_hex4(text, i)
            if 0xDC00 <= low <= 0xDFFF:
                code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)
                i = after
        if 0xD800 <= code <= 0xDFFF:
            # A lone surrogate cannot be encoded as UTF-8: refuse it here, not when rendering.
            raise _fail("unpaired surrogate escape", text, i - 6)
        out.append(chr(code))
    raise _fail("unterminated string", text, start)


def _read_hex4(text: str, i: int) -> tuple[int, int]:
    """Read ``\\uXXXX`` at ``i`` (the backslash); return (code unit, offset after it)."""
    digits = text[i + 2 : i + 6]
    if len(digits) != 4 or not all(c in _HEX for c in digits):
        raise _fail("'\\u' must be followed by four hex digits", text, i)
    return int(digits, 16), i + 6


def _tokenize(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    i = 0
    n = len(text)
    while i < n:
        ch = text[i]
        if ch in " \t\r\n":
            i += 1
        elif ch in _DIGITS:
            j = i
            while j < n and text[j] in _DIGITS:
                j += 1
            if j + 1 < n and text[j] == "." and text[j + 1] in _DIGITS:
                j += 1
                while j < n and text[j] in _DIGITS:
                    j += 1
            literal = text[i:j]
            if j < n and text[j] in _IDENT_START:  # 1e5, 12abc
                raise _fail(f"invalid number {literal + text[j]!r}", text, i,
                            "numbers are digits with an optional fraction (no exponent)")
            number: int | Decimal | None = None
            if len(literal) <= _MAX_LITERAL_DIGITS:
                number = Decimal(literal) if "." in literal else int(literal)
            if number is None or not _in_range(number):
                raise _fail(f"number out of range (more than {_MAX_ADJUSTED + 1} digits)", text, i)
            tokens.append(_Token("number", literal, i, number))
            i = j
        elif ch in "'\"":
            value, j = _read_string(text, i)
            tokens.append(_Token("string", text[i:j], i, value))
            i = j
        elif ch in _IDENT_START:
            j = i
            while j < n and text[j] in _IDENT_CHARS:
                j += 1
            tokens.append(_Token("name", text[i:j], i))
            i = j
        else:
            for op in _OPERATORS:
                if text.startswith(op, i):
                    tokens.append(_Token("op", op, i))
                    i += len(op)
                    break
            else:
                raise _fail(f"unexpected character {ch!r}", text, i)
    tokens.append(_Token("end", "", n))
    return tokens


# --------------------------------------------------------------------------------------------
# Parser (recursive descent, one function per precedence level)
# --------------------------------------------------------------------------------------------

_COMPARISONS = {"=": "=", "==": "=", "!=": "!=", "<>": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}
#: name -> (minimum, maximum) argument count; None = no maximum.
_FUNCTIONS: dict[str, tuple[int, int | None]] = {
    "coalesce": (1, None), "lower": (1, 1), "upper": (1, 1), "concat": (1, None), "substring": (2, 3),
    "length": (1, 1), "int": (1, 1), "floor": (1, 1), "decimal": (1, 1),
}
_CONSTANTS: dict[str, Any] = {"true": True, "false": False, "null": None}
# Parser recursion per nesting level is ~9 Python frames: keep well inside the default limit.
_MAX_NESTING = 50
# The evaluator recurses once per tree level (a long `a + b + c ...` chain is a deep tree).
_MAX_DEPTH = 200


class _Parser:
    """Holds the token cursor; each ``_level`` method parses one precedence level."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokenize(text)
        self.index = 0
        self.nesting = 0

    # -- cursor helpers --

    @property
    def token(self) -> _Token:
        return self.tokens[self.index]

    def advance(self) -> _Token:
        token = self.tokens[self.index]
        if token.kind != "end":
            self.index += 1
        return token

    def at_op(self, *ops: str) -> bool:
        return self.token.kind == "op" and self.token.text in ops

    def at_word(self, *words: str) -> bool:
        return self.token.kind == "name" and self.token.text.lower() in words

    def expect_op(self, op: str) -> _Token:
        if not self.at_op(op):
            raise self.error(f"expected '{op}', found {_describe(self.token)}", self.token)
        return self.advance()

    def error(self, message: str, token: _Token, hint: str = "") -> ExpressionError:
        return _fail(message, self.text, token.pos, hint)

    def unexpected(self) -> ExpressionError:
        return self.error(f"unexpected {_describe(self.token)}", self.token)

    def enter(self) -> None:
        self.nesting += 1
        if self.nesting > _MAX_NESTING:
            raise self.error(f"expression nested more than {_MAX_NESTING} levels deep", self.token)

    # -- grammar --

    def parse(self) -> _Node:
        if self.token.kind == "end":
            raise ExpressionError(f"empty expression {self.text!r}")
        node = self.or_level()
        if self.token.kind != "end":
            raise self.unexpected()
        return node

    def or_level(self) -> _Node:
        node = self.and_level()
        while self.at_word("or"):
            self.advance()
            node = _Or(node, self.and_level())
        return node

    def and_level(self) -> _Node:
        node = self.not_level()
        while self.at_word("and"):
            self.advance()
            node = _And(node, self.not_level())
        return node

    def not_level(self) -> _Node:
        if self.at_word("not"):
            self.advance()
            self.enter()
            node: _Node = _Not(self.not_level())
            self.nesting -= 1
            return node
        return self.comparison_level()

    def comparison_level(self) -> _Node:
        node = self.additive_level()
        if self.token.kind == "op" and self.token.text in _COMPARISONS:
            op = _COMPARISONS[self.advance().text]
            node = _Compare(op, node, self.additive_level())
        elif self.at_word("is"):
            self.advance()
            negated = self.at_word("not")
            if negated:
                self.advance()
            if not self.at_word("null"):
                raise self.error(f"expected 'null' after 'is', found {_describe(self.token)}", self.token)
            self.advance()
            node = _IsNull(node, negated)
        else:
            return node
        if (self.token.kind == "op" and self.token.text in _COMPARISONS) or self.at_word("is"):
            # `a < b < c` reads as a range test but would compare a boolean with c: refuse it.
            raise self.error(f"unexpected {_describe(self.token)}", self.token,
                             "comparisons do not chain, use parentheses")
        return node

    def additive_level(self) -> _Node:
        node = self.term_level()
        while self.at_op("+", "-"):
            op = self.advance().text
            node = _Arithmetic(op, node, self.term_level())
        return node

    def term_level(self) -> _Node:
        node = self.unary_level()
        while self.at_op("*", "/", "%"):
            op = self.advance().text
            node = _Arithmetic(op, node, self.unary_level())
        return node

    def unary_level(self) -> _Node:
        if self.at_op("-"):
            self.advance()
            self.enter()
            node: _Node = _Negate(self.unary_level())
            self.nesting -= 1
            return node
        return self.primary()

    def primary(self) -> _Node:
        token = self.token
        if token.kind in ("number", "string"):
            self.advance()
            return _Literal(token.value)
        if token.kind == "op" and token.text == "(":
            self.advance()
            self.enter()
            node = self.or_level()
            self.nesting -= 1
            self.expect_op(")")
            return node
        if token.kind != "name":
            raise self.unexpected()
        word = token.text.lower()
        self.advance()
        if word in _CONSTANTS:
            return _Literal(_CONSTANTS[word])
        if word == "value":
            return _Path(self.path_steps())
        if word == "agg":
            return _Agg(self.path_steps())
        if word == "key":
            if self.at_op(".", "["):
                raise self.error(f"unexpected {_describe(self.token)}", self.token,
                                 "key is the record key (a string) and has no members; paths start at value")
            return _Key()
        if word in _FUNCTIONS:
            return self.call(word, token)
        if word in ("and", "or", "not", "is"):
            raise self.error(f"unexpected {token.text!r}", token)
        raise self.error(
            f"unknown name {token.text!r}", token,
            "expected key, value, agg, true, false, null, a number, a quoted string or a function: "
            + ", ".join(f"{f}()" for f in _FUNCTIONS) + " (quote string literals)",
        )

    def path_steps(self) -> tuple[str | int, ...]:
        steps: list[str | int] = []
        while True:
            if self.at_op("."):
                self.advance()
                if self.token.kind != "name":
                    raise self.error(f"expected a member name after '.', found {_describe(self.token)}", self.token)
                steps.append(self.advance().text)
            elif self.at_op("["):
                self.advance()
                token = self.token
                if token.kind == "string":
                    steps.append(token.value)
                elif token.kind == "number" and isinstance(token.value, int):
                    steps.append(token.value)
                else:
                    raise self.error(
                        f"expected an array index (a non-negative integer) or a quoted member name, "
                        f"found {_describe(token)}",
                        token,
                    )
                self.advance()
                self.expect_op("]")
            else:
                return tuple(steps)

    def call(self, name: str, name_token: _Token) -> _Node:
        if not self.at_op("("):
            raise self.error(f"function {name_token.text!r} without arguments", name_token, f"call it as {name}(...)")
        self.advance()
        self.enter()
        args = [self.or_level()]
        while self.at_op(","):
            self.advance()
            args.append(self.or_level())
        self.nesting -= 1
        self.expect_op(")")
        low, high = _FUNCTIONS[name]
        if len(args) < low or (high is not None and len(args) > high):
            wanted = f"{low}" if low == high else f"at least {low}"
            plural = "" if low == 1 and high == 1 else "s"
            raise self.error(f"{name}() takes {wanted} argument{plural}, got {len(args)}", name_token)
        return _Call(name, tuple(args))


# --------------------------------------------------------------------------------------------
# Evaluation
# --------------------------------------------------------------------------------------------

# Division is the one inexact operation: 34 significant digits (IEEE decimal128), like Spark's
# decimal division result.
_DIVISION = decimal.Context(prec=34, rounding=decimal.ROUND_HALF_EVEN,
                            Emax=decimal.MAX_EMAX, Emin=decimal.MIN_EMIN)
# + - * on decimals are exact up to 1000 significant digits (far beyond any real value); a
# bound is needed because input coefficients can be arbitrarily long, and 1E+1000 + 1E-1000
# would otherwise need 2001 digits (results out of range become null anyway).
_EXACT = decimal.Context(prec=1000, rounding=decimal.ROUND_HALF_EVEN,
                         Emax=decimal.MAX_EMAX, Emin=decimal.MIN_EMIN)

_ORDERINGS: dict[str, Callable[[Any, Any], bool]] = {
    "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
}


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, Decimal)) and not isinstance(x, bool)


def _normalise(x: Any) -> Any:
    """A float becomes a Decimal of its shortest text; a non-finite or out-of-range number null."""
    cls = x.__class__
    if cls is str or cls is bool or x is None:
        return x
    if cls is int:
        return x if -_INT_LIMIT < x < _INT_LIMIT else None
    if isinstance(x, float):
        x = Decimal(str(x))
    if _is_number(x) and not _in_range(x):
        return None
    return x


def _walk(value: Any, steps: tuple[str | int, ...]) -> Any:
    for step in steps:
        if isinstance(step, str):
            if not isinstance(value, dict):
                return None
            value = value.get(step)
        else:
            if not isinstance(value, list) or step >= len(value):
                return None
            value = value[step]
    return _normalise(value)


def _arithmetic(op: str, left: Any, right: Any) -> Any:
    return _normalise(_exact_arithmetic(op, left, right))


def _exact_arithmetic(op: str, left: Any, right: Any) -> Any:
    if op == "+" and isinstance(left, str) and isinstance(right, str):
        return left + right
    if not (_is_number(left) and _is_number(right)):
        return None
    try:
        if op == "/":
            if right == 0:
                return None
            return _DIVISION.divide(Decimal(left), Decimal(right))
        if op == "%":
            if right == 0:
                return None
            if isinstance(left, int) and isinstance(right, int):
                quotient = abs(left) // abs(right)  # truncated division: the sign is the dividend's
                return left - right * (quotient if (left < 0) == (right < 0) else -quotient)
            return _EXACT.remainder(Decimal(left), Decimal(right))  # Decimal's % truncates too
        if isinstance(left, int) and isinstance(right, int):
            if op == "+":
                return left + right
            if op == "-":
                return left - right
            return left * right
        if op == "+":
            return _EXACT.add(left, right)
        if op == "-":
            return _EXACT.subtract(left, right)
        return _EXACT.multiply(left, right)
    except ArithmeticError:  # decimal overflow / invalid operation
        return None


def _structural_equal(a: Any, b: Any) -> bool:
    """JSON equality: numbers compare numerically, objects ignore member order, bool != number."""
    a, b = _normalise(a), _normalise(b)
    if _is_number(a) and _is_number(b):
        return bool(a == b)
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if a is None or b is None:
        return a is b
    if isinstance(a, str) and isinstance(b, str):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_structural_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_structural_equal(a[k], b[k]) for k in a)
    return False


def _compare(op: str, left: Any, right: Any) -> bool | None:
    if left is None or right is None:
        return None
    if (_is_number(left) and _is_number(right)) or (isinstance(left, str) and isinstance(right, str)):
        if op == "=":
            return bool(left == right)
        if op == "!=":
            return bool(left != right)
        return _ORDERINGS[op](left, right)
    same_kind = (
        (isinstance(left, bool) and isinstance(right, bool))
        or (isinstance(left, dict) and isinstance(right, dict))
        or (isinstance(left, list) and isinstance(right, list))
    )
    if not same_kind or op not in ("=", "!="):
        return None  # mixed types, or an ordering of booleans/objects/arrays
    try:
        equal = _structural_equal(left, right)
    except RecursionError:  # a value nested too deeply to compare: unknown
        return None
    return equal if op == "=" else not equal


def _text_of(x: Any) -> str | None:
    """concat()'s view of a value: strings as they are, numbers and booleans as JSON text."""
    if isinstance(x, str):
        return x
    if isinstance(x, bool) or _is_number(x):
        return render_json(x)
    return None


def _number_of(x: Any) -> int | Decimal | None:
    """int()/floor()/decimal()'s view of a value: a number, or a string holding one (JSON number
    syntax, surrounding blanks allowed); anything else is null."""
    if _is_number(x):
        return _normalise(x)  # type: ignore[no-any-return]
    if not isinstance(x, str) or len(x) > _MAX_LITERAL_DIGITS:
        return None
    try:
        parsed = parse_value(x.strip())
    except ValueError:
        return None
    return _normalise(parsed) if _is_number(parsed) else None  # type: ignore[no-any-return]


def _integer(x: Any, rounding: str) -> int | None:
    n = _number_of(x)
    if n is None or isinstance(n, int):
        return n
    return int(n.to_integral_value(rounding=rounding))


def _substring(s: Any, start: Any, length: Any) -> str | None:
    if not isinstance(s, str) or not isinstance(start, int) or isinstance(start, bool) or start < 1:
        return None
    if length is None:
        return s[start - 1:]
    if not isinstance(length, int) or isinstance(length, bool) or length < 0:
        return None
    return s[start - 1:start - 1 + length]


def _call(function: str, values: list[Any]) -> Any:
    if function == "concat":
        parts = [_text_of(v) for v in values]
        return None if any(p is None for p in parts) else "".join(parts)  # type: ignore[arg-type]
    if function == "substring":
        return _substring(values[0], values[1], values[2] if len(values) > 2 else None)
    x = values[0]
    if function == "length":
        return len(x) if isinstance(x, str) else None
    if function == "int":
        return _integer(x, decimal.ROUND_DOWN)
    if function == "floor":
        return _integer(x, decimal.ROUND_FLOOR)
    if function == "decimal":
        return _number_of(x)
    if not isinstance(x, str):
        return None
    return x.lower() if function == "lower" else x.upper()


#: A compiled expression: (key, value, agg) -> result.
_Fn = Callable[[Any, Any, Any], Any]

#: Comparison operators on two ints or two strings (``_compare``'s first case).
_SAME_KIND_COMPARISONS: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq, "!=": operator.ne, **_ORDERINGS,
}
_INT_ARITHMETIC: dict[str, Callable[[int, int], int]] = {"+": operator.add, "-": operator.sub, "*": operator.mul}


def _compile(node: _Node) -> _Fn:
    """The node as a Python function of (key, value, agg), built once per expression: it
    computes exactly what the node means (``_compare``, ``_arithmetic``, ``_call`` ...), with
    the common cases (a member of the value, two ints or two strings compared, int arithmetic)
    taken without the general helpers. Recurses once per tree level, as evaluation does."""
    match node:
        case _Literal(literal):
            return lambda key, value, agg: literal
        case _Path(steps):
            return _compile_path(steps, of_agg=False)
        case _Agg(steps):
            return _compile_path(steps, of_agg=True)
        case _Key():
            return lambda key, value, agg: _normalise(key)
        case _Compare(op, left, right):
            return _compile_compare(op, _compile(left), _compile(right))
        case _And(left, right):
            return _compile_and(_compile(left), _compile(right))
        case _Or(left, right):
            return _compile_or(_compile(left), _compile(right))
        case _Not(operand):
            return _compile_not(_compile(operand))
        case _IsNull(operand, negated):
            inner = _compile(operand)
            return lambda key, value, agg: (inner(key, value, agg) is None) != negated
        case _Arithmetic(op, left, right):
            return _compile_arithmetic(op, _compile(left), _compile(right))
        case _Negate(operand):
            return _compile_negate(_compile(operand))
        case _Call("coalesce", args):
            return _compile_coalesce(tuple(_compile(arg) for arg in args))
        case _Call(function, args):
            fns = tuple(_compile(arg) for arg in args)
            return lambda key, value, agg: _call(function, [f(key, value, agg) for f in fns])
    raise AssertionError(f"unknown node {node!r}")  # pragma: no cover - the parser builds only the above


def _compile_path(steps: tuple[str | int, ...], of_agg: bool) -> _Fn:
    if len(steps) == 1 and isinstance(steps[0], str):
        name = steps[0]
        if of_agg:
            def agg_member(key: Any, value: Any, agg: Any) -> Any:
                return _normalise(agg.get(name)) if isinstance(agg, dict) else None
            return agg_member

        def member(key: Any, value: Any, agg: Any) -> Any:
            return _normalise(value.get(name)) if isinstance(value, dict) else None
        return member
    if of_agg:
        return lambda key, value, agg: _walk(agg, steps)
    return lambda key, value, agg: _walk(value, steps)


def _compile_compare(op: str, left: _Fn, right: _Fn) -> _Fn:
    same_kind = _SAME_KIND_COMPARISONS[op]

    def compare(key: Any, value: Any, agg: Any) -> Any:
        a = left(key, value, agg)
        b = right(key, value, agg)
        kind = a.__class__
        if (kind is int or kind is str) and b.__class__ is kind:
            return same_kind(a, b)
        return _compare(op, a, b)
    return compare


def _compile_and(left: _Fn, right: _Fn) -> _Fn:
    def and_(key: Any, value: Any, agg: Any) -> Any:
        a = left(key, value, agg)  # three-valued: only True and False count, anything else is unknown
        if a is False:
            return False
        b = right(key, value, agg)
        if b is False:
            return False
        return True if a is True and b is True else None
    return and_


def _compile_or(left: _Fn, right: _Fn) -> _Fn:
    def or_(key: Any, value: Any, agg: Any) -> Any:
        a = left(key, value, agg)
        if a is True:
            return True
        b = right(key, value, agg)
        if b is True:
            return True
        return False if a is False and b is False else None
    return or_


def _compile_not(operand: _Fn) -> _Fn:
    def not_(key: Any, value: Any, agg: Any) -> Any:
        t = operand(key, value, agg)
        return False if t is True else True if t is False else None
    return not_


def _compile_arithmetic(op: str, left: _Fn, right: _Fn) -> _Fn:
    exact = _INT_ARITHMETIC.get(op)
    if exact is None:
        return lambda key, value, agg: _arithmetic(op, left(key, value, agg), right(key, value, agg))

    def arithmetic(key: Any, value: Any, agg: Any) -> Any:
        a = left(key, value, agg)
        b = right(key, value, agg)
        if a.__class__ is int and b.__class__ is int:
            return _normalise(exact(a, b))
        return _arithmetic(op, a, b)
    return arithmetic


def _compile_negate(operand: _Fn) -> _Fn:
    def negate(key: Any, value: Any, agg: Any) -> Any:
        x = operand(key, value, agg)
        if not _is_number(x):
            return None
        return x.copy_negate() if isinstance(x, Decimal) else -x  # copy_negate: no context rounding
    return negate


def _compile_coalesce(args: tuple[_Fn, ...]) -> _Fn:
    def coalesce(key: Any, value: Any, agg: Any) -> Any:
        for arg in args:
            result = arg(key, value, agg)
            if result is not None:
                return result
        return None
    return coalesce


# --------------------------------------------------------------------------------------------
# Public entry points
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Expression:
    """A parsed expression; equal (and hashed) by its text.

    Constructing one parses ``text`` (raising ``ExpressionError``) and compiles the tree into
    one Python function (``_compile``), so an ``Expression`` that exists is always valid and
    evaluation needs no error path. It pickles as its text (and compiles again when loaded).
    """

    text: str
    _root: _Node = field(init=False, repr=False, compare=False)
    _fn: _Fn = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        root = _parse(self.text)
        object.__setattr__(self, "_root", root)
        object.__setattr__(self, "_fn", _compile(root))

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return Expression, (self.text,)

    def evaluate(self, key: str, value: Any, agg: Any = None) -> Any:
        """Evaluate over a record: ``key`` (its key string) and ``value`` (``parse_value`` of its
        value, or None), and ``agg`` (the current aggregate, for an aggregate's adder and
        subtractor). Never raises: every failure is None (null).
        """
        return self._fn(key, value, agg)

    @property
    def uses_agg(self) -> bool:
        """Whether the expression reads ``agg`` (allowed only in an aggregate's add/subtract)."""
        stack: list[_Node] = [self._root]
        while stack:
            node = stack.pop()
            if isinstance(node, _Agg):
                return True
            stack.extend(_children(node))
        return False


def _parse(text: str) -> _Node:
    if not isinstance(text, str):
        raise ExpressionError(f"an expression must be a string, not {type(text).__name__}")
    root = _Parser(text).parse()
    if _depth(root) > _MAX_DEPTH:
        raise ExpressionError(f"expression more than {_MAX_DEPTH} operations deep in {text!r}")
    return root


def parse_expression(text: str) -> Expression:
    """Parse ``text``; raise ``ExpressionError`` (quoting the text and the column) if invalid."""
    return Expression(text)
