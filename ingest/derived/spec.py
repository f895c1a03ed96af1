"""The ``tables:`` section of a pipeline file: one ``TableSpec`` per derived table or stream.

Everything is checked at load, before any data is touched (exit status 2): the operation and
its fields, the expressions (parsed here), that every input is declared earlier in the file,
input kinds (tables vs streams), and docs/semantics.md rule 18 (suppress on a versioned table,
a versioned global table).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from versiq.durations import DEFAULT_HISTORY_RETENTION_MS, DurationError, parse_duration_ms
from versiq.ingest.derived.expressions import Expression, ExpressionError, parse_expression
from versiq.ingest.errors import UsageError
from versiq.layout import DEFAULT_BUCKETS, KINDS, STREAM_KIND
from versiq.names import check_store_name

JOIN_TYPES = {"join": ("inner", "left", "outer"), "fk_join": ("inner", "left"), "stream_join": ("inner", "left")}
AGGREGATES = ("count", "sum")
#: A custom aggregate's fields (Kafka's aggregate(initializer, adder, subtractor)) and a reduce's.
AGGREGATOR_FIELDS = ("init", "add", "subtract")
REDUCER_FIELDS = ("add", "subtract")

_COMMON = {"name", "kind", "history_retention", "buckets", "global", "suppress"}
_FIELDS = {
    "filter": {"from", "filter"},
    "copy": {"from"},
    "to_table": {"from", "filter"},
    "aggregate": {"from", "group_by", "aggregate", "reduce"},
    "join": {"join", "select"},
    "fk_join": {"fk_join", "select"},
    "stream_join": {"stream_join", "select"},
}


@dataclass(frozen=True)
class Aggregator:
    """A custom table aggregate (KIP-904 semantics, docs/derived-tables.md "Values").

    ``aggregate: {init, add, subtract}`` is Kafka's ``aggregate(initializer, adder, subtractor)``;
    ``reduce: {add, subtract}`` is Kafka's ``reduce(adder, subtractor)`` (``init`` is None: a
    group's first value is its aggregate). ``add``/``subtract`` read ``agg`` (the group's current
    aggregate), ``value`` (the input value) and ``key`` (the group key, as Kafka's Aggregator is
    given); a null result deletes the group, as a null aggregate does in Kafka.
    """

    add: Expression
    subtract: Expression
    init: Expression | None = None


@dataclass(frozen=True)
class TableSpec:
    """One derived table (``kind`` versioned/timestamped) or stream output (``kind`` stream)."""

    name: str
    op: str
    inputs: tuple[str, ...]
    kind: str = "versioned"
    history_retention_ms: int = DEFAULT_HISTORY_RETENTION_MS
    buckets: int = DEFAULT_BUCKETS
    filter: Expression | None = None
    join_type: str = "inner"
    foreign_key: Expression | None = None
    group_by: Expression | None = None
    #: (name, expression or None for count), in the fixed order count, sum.
    aggregates: tuple[tuple[str, Expression | None], ...] = ()
    #: A custom aggregate or reduce (then ``aggregates`` is empty).
    aggregator: Aggregator | None = None
    select: tuple[tuple[str, Expression], ...] | None = None
    #: Canonical JSON of the pipeline entry (without its name): committed with every snapshot,
    #: so a changed definition is detected instead of silently applied to new records only.
    definition: str = ""

    @property
    def is_stream(self) -> bool:
        return self.kind == STREAM_KIND


def _expr(where: str, field: str, text: Any, agg: bool = False) -> Expression:
    """Parse one expression of the entry; ``agg``: whether it may read the current aggregate."""
    if not isinstance(text, str) or not text.strip():
        raise UsageError(f"{where}: '{field}' must be an expression (a non-empty string)")
    try:
        expression = parse_expression(text)
    except ExpressionError as exc:
        raise UsageError(f"{where}: '{field}': {exc}") from None
    if expression.uses_agg and not agg:
        raise UsageError(f"{where}: '{field}' reads 'agg', which only an aggregate's or a reduce's add and "
                         "subtract have (the group's current aggregate)")
    return expression


def _name(where: str, entry: dict[str, Any], field: str, sub: dict[str, Any] | None = None) -> str:
    value = (sub if sub is not None else entry).get(field)
    if not isinstance(value, str) or not value:
        raise UsageError(f"{where}: '{field}' is required (the name of an earlier store, stream or table)")
    return value


def parse_tables(entries: Any, kinds: dict[str, str]) -> list[TableSpec]:
    """Parse ``tables:``. ``kinds`` maps every declared store/stream to its kind
    (versioned/timestamped/stream); it grows as tables are parsed (file order = DAG order)."""
    if entries is None:
        return []
    if not isinstance(entries, list):
        raise UsageError("'tables:' must be a list")
    kinds = dict(kinds)
    specs: list[TableSpec] = []
    for index, entry in enumerate(entries):
        spec = _table(entry, index, kinds)
        kinds[spec.name] = spec.kind
        specs.append(spec)
    return specs


def _op_of(where: str, entry: dict[str, Any], kinds: dict[str, str]) -> str:
    ops = [op for op in ("join", "fk_join", "stream_join", "group_by") if op in entry]
    if len(ops) > 1 or (ops and "from" in entry and ops[0] != "group_by"):
        raise UsageError(f"{where}: exactly one operation per table (from/filter, group_by, join, fk_join, "
                         f"stream_join); found {', '.join(ops + (['from'] if 'from' in entry else []))}")
    if ops == ["group_by"]:
        return "aggregate"
    if ops:
        return ops[0]
    if "from" not in entry:
        raise UsageError(f"{where}: no operation (give from, group_by, join, fk_join or stream_join)")
    source = _name(where, entry, "from")
    if kinds.get(source) == STREAM_KIND:
        return "to_table"
    return "filter" if "filter" in entry else "copy"


def _table(entry: Any, index: int, kinds: dict[str, str]) -> TableSpec:
    where = f"tables[{index}]"
    if not isinstance(entry, dict):
        raise UsageError(f"{where}: expected a mapping")
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise UsageError(f"{where}: 'name' is required (a string)")
    try:
        check_store_name(name)
    except ValueError as exc:
        raise UsageError(f"{where}: {exc}") from None
    where = f"{where} ({name})"
    if name in kinds:
        raise UsageError(f"{where}: the name {name!r} is already used by another store, stream or table")
    op = _op_of(where, entry, kinds)
    unknown = set(entry) - _COMMON - _FIELDS[op]
    if unknown:
        raise UsageError(f"{where}: unknown field(s) for a {op} table: {', '.join(sorted(unknown))}")

    def input_of(field: str, sub: dict[str, Any] | None = None, want: str = "table") -> str:
        source = _name(where, entry, field, sub)
        if source not in kinds:
            raise UsageError(f"{where}: '{field}' names {source!r}, which is not a store, stream or table "
                             "declared earlier in the file")
        is_stream = kinds[source] == STREAM_KIND
        if want == "table" and is_stream:
            raise UsageError(f"{where}: '{field}' must be a table, but {source!r} is a stream")
        if want == "stream" and not is_stream:
            raise UsageError(f"{where}: '{field}' must be a stream, but {source!r} is a table")
        return source

    fields: dict[str, Any] = {}
    if op in ("filter", "copy"):
        fields["inputs"] = (input_of("from"),)
        if op == "filter":
            fields["filter"] = _expr(where, "filter", entry["filter"])
    elif op == "to_table":
        fields["inputs"] = (input_of("from", want="stream"),)
        if "filter" in entry:
            fields["filter"] = _expr(where, "filter", entry["filter"])
    elif op == "aggregate":
        fields["inputs"] = (input_of("from"),)
        fields["group_by"] = _expr(where, "group_by", entry["group_by"])
        if ("aggregate" in entry) == ("reduce" in entry):
            raise UsageError(f"{where}: a group_by table needs exactly one of 'aggregate' and 'reduce'")
        if "reduce" in entry:
            fields["aggregator"] = _aggregator(where, "reduce", entry["reduce"], REDUCER_FIELDS)
        elif isinstance(entry["aggregate"], dict) and set(entry["aggregate"]) & set(AGGREGATOR_FIELDS):
            fields["aggregator"] = _aggregator(where, "aggregate", entry["aggregate"], AGGREGATOR_FIELDS)
        else:
            fields["aggregates"] = _aggregates(where, entry.get("aggregate"))
    else:
        sub = entry[op]
        if not isinstance(sub, dict):
            raise UsageError(f"{where}: '{op}' must be a mapping")
        sides = ("stream", "table") if op == "stream_join" else ("left", "right")
        allowed = {*sides, "type"} | ({"foreign_key"} if op == "fk_join" else set())
        extra = set(sub) - allowed
        if extra:
            raise UsageError(f"{where}: unknown field(s) in '{op}': {', '.join(sorted(extra))}")
        fields["inputs"] = tuple(input_of(side, sub, "stream" if side == "stream" else "table") for side in sides)
        join_type = sub.get("type", "inner")
        if join_type not in JOIN_TYPES[op]:
            raise UsageError(f"{where}: '{op}.type' must be one of {', '.join(JOIN_TYPES[op])}")
        fields["join_type"] = join_type
        if op == "fk_join":
            fields["foreign_key"] = _expr(where, "fk_join.foreign_key", sub.get("foreign_key"))
        if "select" in entry:
            fields["select"] = _select(where, entry["select"])

    kind = entry.get("kind", STREAM_KIND if op == "stream_join" else "versioned")
    if op == "stream_join":
        if kind != STREAM_KIND:
            raise UsageError(f"{where}: a stream_join's output is a stream; materialise it with a table "
                             "'from' it instead of setting 'kind'")
    elif kind not in KINDS:
        raise UsageError(f"{where}: 'kind' must be one of {', '.join(KINDS)}")
    fields["kind"] = kind
    if "history_retention" in entry:
        try:
            fields["history_retention_ms"] = parse_duration_ms(entry["history_retention"])
        except DurationError as exc:
            raise UsageError(f"{where}: history_retention: {exc}") from None
    if "buckets" in entry:
        buckets = entry["buckets"]
        if not isinstance(buckets, int) or isinstance(buckets, bool) or not 1 <= buckets <= 4096:
            raise UsageError(f"{where}: 'buckets' must be an integer in [1, 4096]")
        fields["buckets"] = buckets
    _rule_18(where, entry, kind, [kinds[i] for i in fields["inputs"]])
    fields["definition"] = json.dumps({k: v for k, v in entry.items() if k != "name"}, sort_keys=True,
                                      separators=(",", ":"), default=str)
    return TableSpec(name=name, op=op, **fields)


def _rule_18(where: str, entry: dict[str, Any], kind: str, input_kinds: list[str]) -> None:
    """docs/semantics.md rule 18 (KIP-914): no suppress on a versioned table, no versioned global table."""
    if "suppress" in entry:
        if "versioned" in input_kinds:
            raise UsageError(f"{where}: suppress cannot be applied to a versioned table (KIP-914: a versioned "
                             "table keeps every version; suppressing updates would break its history)")
        raise UsageError(f"{where}: suppress is not supported")
    if entry.get("global") is True and kind == "versioned":
        raise UsageError(f"{where}: a global table cannot be versioned (KIP-914); use kind: timestamped")
    if "global" in entry and not isinstance(entry["global"], bool):
        raise UsageError(f"{where}: 'global' must be true or false")


def check_global_store(where: str, entry: dict[str, Any], kind: str) -> None:
    """``global: true`` on a source store: refused when the store is versioned (rule 18)."""
    _rule_18(where, {k: v for k, v in entry.items() if k == "global"}, kind, [])


def _aggregates(where: str, spec: Any) -> tuple[tuple[str, Expression | None], ...]:
    if not isinstance(spec, dict) or not spec:
        raise UsageError(f"{where}: 'aggregate' must be a mapping such as {{count: true, sum: \"value.amount\"}}")
    unknown = set(spec) - set(AGGREGATES)
    if unknown:
        raise UsageError(f"{where}: unknown aggregate(s): {', '.join(sorted(unknown))} (known: count, sum)")
    out: list[tuple[str, Expression | None]] = []
    if "count" in spec:
        if spec["count"] is not True:
            raise UsageError(f"{where}: 'aggregate.count' must be true")
        out.append(("count", None))
    if "sum" in spec:
        out.append(("sum", _expr(where, "aggregate.sum", spec["sum"])))
    if not out:
        raise UsageError(f"{where}: 'aggregate' declares nothing")
    return tuple(out)


def _aggregator(where: str, name: str, spec: Any, wanted: tuple[str, ...]) -> Aggregator:
    if not isinstance(spec, dict) or set(spec) != set(wanted):
        got = ", ".join(sorted(map(str, spec))) if isinstance(spec, dict) else type(spec).__name__
        raise UsageError(f"{where}: '{name}' must be a mapping with exactly {', '.join(wanted)} (expressions); "
                         f"got {got}")
    return Aggregator(add=_expr(where, f"{name}.add", spec["add"], agg=True),
                      subtract=_expr(where, f"{name}.subtract", spec["subtract"], agg=True),
                      init=_expr(where, f"{name}.init", spec["init"]) if "init" in spec else None)


def _select(where: str, spec: Any) -> tuple[tuple[str, Expression], ...]:
    if not isinstance(spec, dict) or not spec:
        raise UsageError(f"{where}: 'select' must be a mapping of member name -> expression")
    out = []
    for member, text in spec.items():
        if not isinstance(member, str) or not member:
            raise UsageError(f"{where}: 'select' member names must be non-empty strings")
        out.append((member, _expr(where, f"select.{member}", text)))
    return tuple(out)
