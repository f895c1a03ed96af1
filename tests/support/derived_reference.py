"""A naive, record-at-a-time reference model of a whole derived-table pipeline (issue #5).

Written from the documents only: docs/semantics.md (rules 13-18 and "Operator details"), the KIPs
it names (KIP-914, KIP-904, KIP-213) and docs/derived-tables.md. It does not look at
``ingest/derived/``; the implementation must agree with it. Everything is dicts, lists and linear
scans so that each operator can be checked by eye against docs/derived-tables.md "Operators".

Where this model departs from docs/derived-tables.md because a normative KIP example says
otherwise (KIP + docs/semantics.md win), the place is marked ``KIP OVERRIDE``.

Source stores reuse ``tests.support.reference.ReferenceStore`` (grace, stream time per partition,
versions, as-of reads), and so do the derived tables' own stores (one partition each).
"""

from __future__ import annotations

import decimal
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

from tests.support.reference import InRecord, ReferenceStore, RunCounts
from versiq.ingest.derived.expressions import is_true, key_string, parse_expression, parse_value, render_json

DEFAULT_RETENTION_MS = 86_400_000


# --------------------------------------------------------------------------------------- API types
@dataclass(frozen=True)
class Rec:
    """One input record; value is compact JSON text or None (tombstone / null event)."""

    key: str
    value: str | None
    timestamp: int
    partition: int = 0  # only meaningful for source stores with partitions > 1


@dataclass(frozen=True)
class InputDef:
    name: str
    kind: str  # "versioned" | "timestamped" | "stream"
    history_retention_ms: int = DEFAULT_RETENTION_MS
    partitions: int = 1


@dataclass(frozen=True)
class Emission:
    run: int
    sequence: int
    key: str
    value: str | None
    timestamp: int
    cause: str


Versions = dict[str, list[tuple[int, int | None, str | None]]]


@dataclass
class TableResult:
    emissions: list[Emission]  # what the operator emitted, in order (before its store's grace)
    versions: Versions  # store tables: key -> [(valid_from, valid_to, value)] ascending; {} for streams
    records: list[tuple[str, str | None, int]]  # stream outputs only: (key, value, timestamp) in order
    counts: dict[str, int]  # emitted, accepted_latest, accepted_out_of_order, tombstones, late


# ------------------------------------------------------------------------ what flows between nodes
@dataclass(frozen=True)
class Change:
    """A table change (docs "Changes"): the result of applying one record to a table's store."""

    key: str
    new: str | None
    old: str | None
    ts: int
    in_order: bool


@dataclass(frozen=True)
class Event:
    """One stream record (a source stream's record or a stream output's record)."""

    key: str
    value: str | None
    ts: int


# ----------------------------------------------------------------------------------------- a table
class Table:
    """A table's store: versioned (own grace) or timestamped. Wraps ``ReferenceStore``."""

    def __init__(self, kind: str, history_retention_ms: int, partitions: int = 1) -> None:
        assert kind in ("versioned", "timestamped"), kind
        self.kind = kind
        self.store = ReferenceStore(kind, history_retention_ms, partitions)
        self.counts = RunCounts()  # cumulative over all runs

    @property
    def versioned(self) -> bool:
        return self.kind == "versioned"

    def apply(self, key: str, value: str | None, ts: int, partition: int = 0) -> Change | None:
        """Put one record; return the change it yields, or None when it was late (rule 3)."""
        old = self.latest_value(key)
        before = (self.counts.accepted_latest, self.counts.rejected["late"])
        self.store._put(partition, InRecord("", 0, key, value, ts, partition), self.counts)
        if self.counts.rejected["late"] != before[1]:
            return None
        self.store.home.setdefault(key, partition)
        if not self.versioned:
            return Change(key, value, old, ts, True)  # offset semantics: always "in order"
        in_order = self.counts.accepted_latest != before[0]  # rule 4: put was "latest"
        return Change(key, value, old, ts, in_order)

    def latest(self, key: str) -> tuple[str, int] | None:
        """(value, timestamp) of the key's latest value; None when none or a tombstone."""
        v = self.store.latest(key)
        if v is None or v.value is None:
            return None
        return (v.value, v.timestamp)

    def latest_value(self, key: str) -> str | None:
        found = self.latest(key)
        return None if found is None else found[0]

    def prev_ts(self, key: str) -> int | None:
        """Timestamp of the key's current latest version, tombstones included (docs ``prev(k)``)."""
        if self.versioned:
            stamps = list(self.store.versions.get(key, {}))
            return max(stamps) if stamps else None
        cur = self.store.current.get(key)
        return None if cur is None else cur[1]

    def lookup_as_of(self, key: str, ts: int) -> tuple[str, int] | None:
        """Stream-table join lookup: rules 7-8 (versioned) or the current value (timestamped)."""
        if not self.versioned:
            return self.latest(key)
        status, v = self.store.as_of(key, ts)
        if status != "ok" or v is None or v.value is None:
            return None
        return (v.value, v.timestamp)

    def keys(self) -> list[str]:
        if self.versioned:
            return sorted(self.store.versions)
        return sorted(self.store.current)

    def dump(self) -> Versions:
        out: Versions = {}
        for key in self.keys():
            if self.versioned:
                out[key] = [(v.timestamp, v.valid_to, v.value) for v in self.store.all_versions(key)]
            else:
                value, ts = self.store.current[key]
                if value is not None:  # a tombstone deletes the key of a timestamped store (rule 12)
                    out[key] = [(ts, None, value)]
        return out


# ------------------------------------------------------------------------------------- expressions
def _evaluate(expr: str, key: str, value: str | None) -> Any:
    return parse_expression(expr).evaluate(key, parse_value(value))


def _key_of(expr: str, key: str, value: str) -> str | None:
    """A group key / foreign key: null means "none", anything else becomes a key string."""
    result = _evaluate(expr, key, value)
    return None if result is None else key_string(result)


def _is_number(x: Any) -> bool:
    return isinstance(x, int | Decimal) and not isinstance(x, bool)


# --------------------------------------------------------------------------------- derived tables
@dataclass
class Derived:
    spec: dict[str, Any]
    name: str
    op: str  # filter, copy, to_table, stream_filter_to_table, aggregate, join, fk_join, stream_join
    inputs: list[str]
    table: Table | None  # None for stream outputs
    emissions: list[Emission] = field(default_factory=list)
    records: list[tuple[str, str | None, int]] = field(default_factory=list)
    emitted: int = 0


def _join_value(spec: dict[str, Any], key: str, left: str | None, right: str | None) -> str:
    """'{"left":L,"right":R}' built textually, or the ``select`` projection over it."""
    select = spec.get("select")
    if not select:
        left_text = "null" if left is None else left
        right_text = "null" if right is None else right
        return '{"left":' + left_text + ',"right":' + right_text + "}"
    value = {"left": parse_value(left), "right": parse_value(right)}
    obj = {member: parse_expression(expr).evaluate(key, value) for member, expr in select.items()}
    return render_json(obj)


class Pipeline:
    def __init__(self, inputs: list[InputDef], tables: list[dict[str, Any]]) -> None:
        self.inputs = inputs
        self.kind: dict[str, str] = {}  # name -> "versioned" | "timestamped" | "stream"
        self.tables_by_name: dict[str, Table] = {}
        for d in inputs:
            assert d.kind in ("versioned", "timestamped", "stream"), d
            self.kind[d.name] = d.kind
            if d.kind != "stream":
                self.tables_by_name[d.name] = Table(d.kind, d.history_retention_ms, d.partitions)
        self.derived: list[Derived] = [self._define(spec) for spec in tables]
        self.run = 0
        self.sequence: dict[str, int] = {}
        #: aggregate -> its routed group updates (group, change, subtract, add) of the current run
        self.routed: dict[str, list[tuple[str, Change, str | None, str | None]]] = {}

    # ------------------------------------------------------------------ definition
    def _define(self, spec: dict[str, Any]) -> Derived:
        name = spec["name"]
        assert name not in self.kind, f"duplicate name {name}"
        if "join" in spec:
            op, inputs = "join", [spec["join"]["left"], spec["join"]["right"]]
        elif "fk_join" in spec:
            op, inputs = "fk_join", [spec["fk_join"]["left"], spec["fk_join"]["right"]]
        elif "stream_join" in spec:
            op, inputs = "stream_join", [spec["stream_join"]["stream"], spec["stream_join"]["table"]]
        elif "group_by" in spec:
            op, inputs = "aggregate", [spec["from"]]
        elif "filter" in spec:
            op, inputs = "filter", [spec["from"]]
        else:
            op, inputs = "copy", [spec["from"]]
        for i in inputs:
            assert i in self.kind, f"{name}: unknown input {i} (inputs must be declared earlier)"
        assert len(set(inputs)) == len(inputs), f"{name}: joining an input with itself is not modelled"
        if op in ("join", "fk_join", "aggregate"):
            assert all(self.kind[i] != "stream" for i in inputs), f"{name}: {op} needs table inputs"
        if op == "stream_join":
            assert self.kind[inputs[0]] == "stream" and self.kind[inputs[1]] != "stream", name
        if op in ("filter", "copy") and self.kind[inputs[0]] == "stream":
            op = "to_table" if op == "copy" else "stream_filter_to_table"
        if op == "stream_join":
            self.kind[name] = "stream"
            return Derived(spec, name, op, inputs, None)
        kind = spec.get("kind", "versioned")
        table = Table(kind, spec.get("history_retention_ms", DEFAULT_RETENTION_MS))
        self.kind[name] = kind
        self.tables_by_name[name] = table
        return Derived(spec, name, op, inputs, table)

    # ------------------------------------------------------------------ processing
    def apply_group_update(self, name: str, group: str, c: Change, subtract: str | None, add: str | None) -> None:
        """Aggregate ``name`` applies one group update that crossed a repartition."""
        t = next(d for d in self.derived if d.name == name)
        key, value, ts = self._update_group(t, group, c, subtract, add)
        self._emit(t, t.inputs[0], key, value, ts)

    def process_run(self, records: dict[str, list[Rec]]) -> None:
        """One run: merge the inputs record by record by head timestamp (ties: first declared)."""
        self.run += 1
        self.sequence = {}
        for routed in self.routed.values():
            routed.clear()
        unknown = set(records) - {d.name for d in self.inputs}
        assert not unknown, f"records for unknown inputs {unknown}"
        position = {d.name: 0 for d in self.inputs}
        while True:
            best: InputDef | None = None
            for d in self.inputs:
                recs = records.get(d.name, [])
                if position[d.name] >= len(recs):
                    continue
                head = recs[position[d.name]]
                if best is None or head.timestamp < records[best.name][position[best.name]].timestamp:
                    best = d
            if best is None:
                return
            rec = records[best.name][position[best.name]]
            position[best.name] += 1
            self._source_record(best, rec)

    def _source_record(self, d: InputDef, rec: Rec) -> None:
        if d.kind == "stream":
            self._propagate(d.name, Event(rec.key, rec.value, rec.timestamp))
            return
        partition = rec.partition if d.partitions > 1 else 0
        assert 0 <= partition < d.partitions, f"{d.name}: bad partition {rec.partition}"
        change = self.tables_by_name[d.name].apply(rec.key, rec.value, rec.timestamp, partition)
        if change is not None:
            self._propagate(d.name, change)

    def _propagate(self, source: str, item: Change | Event) -> None:
        """Depth-first: every dependent table, in file order, sees ``item`` (and so on downstream).
        An aggregate in ``self.routed`` only routes its input's changes there (a repartition)."""
        for t in self.derived:
            if source in t.inputs:
                if t.name in self.routed:
                    assert isinstance(item, Change)
                    self.routed[t.name] += [(group, item, subtract, add)
                                            for group, subtract, add in self._route(t, source, item)]
                    continue
                for key, value, ts in self._operate(t, source, item):
                    self._emit(t, source, key, value, ts)

    def _emit(self, t: Derived, cause: str, key: str, value: str | None, ts: int) -> None:
        self.sequence[t.name] = self.sequence.get(t.name, 0) + 1
        # a store read whole (``<name>*``) is the store as a cause
        t.emissions.append(Emission(self.run, self.sequence[t.name], key, value, ts, cause.removesuffix("*")))
        t.emitted += 1
        if t.table is None:  # a stream output
            t.records.append((key, value, ts))
            self._propagate(t.name, Event(key, value, ts))
            return
        change = t.table.apply(key, value, ts)  # its own grace: late results yield no change
        if change is not None:
            self._propagate(t.name, change)

    # ------------------------------------------------------------------ operators
    def _operate(self, t: Derived, source: str, item: Change | Event) -> list[tuple[str, str | None, int]]:
        if t.op == "stream_join":
            if source != t.inputs[0]:
                return []  # a change of the table side never triggers a stream-table join
            assert isinstance(item, Event)
            return self._stream_join(t, item)
        if t.op in ("to_table", "stream_filter_to_table"):
            assert isinstance(item, Event)
            return self._to_table(t, item)
        assert isinstance(item, Change)
        if t.op == "filter":
            return self._filter(t, source, item)
        if t.op == "copy":
            return [(item.key, item.new, item.ts)]
        if t.op == "aggregate":
            return self._aggregate(t, source, item)
        if t.op == "join":
            return self._join(t, source, item)
        if t.op == "fk_join":
            return self._fk_join(t, source, item)  # Kafka's subscription protocol (rule 27)
        raise AssertionError(t.op)

    def _out(self, t: Derived) -> Table:
        assert t.table is not None
        return t.table

    def _floor(self, t: Derived, key: str, *stamps: int | None) -> int:
        """Join result timestamp: max(trigger ts, other side's ts when it has a value, prev(k))."""
        return max(s for s in (*stamps, self._out(t).prev_ts(key)) if s is not None)

    def _filter(self, t: Derived, source: str, c: Change) -> list[tuple[str, str | None, int]]:
        predicate = t.spec["filter"]

        def result(value: str | None) -> str | None:
            if value is not None and is_true(_evaluate(predicate, c.key, value)):
                return value
            return None

        new = result(c.new)
        if new is None and self.kind[source] != "versioned" and self._out(t).latest_value(c.key) is None:
            # Kafka's duplicate-tombstone optimisation, only for a non-versioned input (rule 13):
            # KTableFilter compares with its own materialized result, not the input's old value
            return []
        return [(c.key, new, c.ts)]

    def _to_table(self, t: Derived, e: Event) -> list[tuple[str, str | None, int]]:
        if t.op == "stream_filter_to_table" and not is_true(_evaluate(t.spec["filter"], e.key, e.value)):
            return []  # a stream filter drops, it does not delete
        return [(e.key, e.value, e.ts)]

    def _stream_join(self, t: Derived, e: Event) -> list[tuple[str, str | None, int]]:
        spec = t.spec["stream_join"]
        if e.value is None:
            return []  # stream records with a null value are skipped
        found = self.tables_by_name[spec["table"]].lookup_as_of(e.key, e.ts)
        if found is None:
            if spec["type"] == "inner":
                return []
            return [(e.key, _join_value(t.spec, e.key, e.value, None), e.ts)]
        return [(e.key, _join_value(t.spec, e.key, e.value, found[0]), e.ts)]

    def _join(self, t: Derived, source: str, c: Change) -> list[tuple[str, str | None, int]]:
        spec = t.spec["join"]
        kind = spec["type"]
        x_is_left = source == spec["left"]
        other = spec["right"] if x_is_left else spec["left"]
        if self.kind[source] == "versioned" and not c.in_order:
            return []  # rule 15: out-of-order records of a versioned side emit nothing
        y_found = self.tables_by_name[other].latest(c.key)
        y = None if y_found is None else y_found[0]
        y_ts = None if y_found is None else y_found[1]
        x = c.new
        left, right = (x, y) if x_is_left else (y, x)
        if kind == "inner":
            if y is None:
                return []
            value = None if x is None else _join_value(t.spec, c.key, left, right)
        elif kind == "left":
            if x_is_left:
                if x is None and c.old is None and y is None:
                    return []  # KTableKTableLeftJoin: null -> null with no right value (rule 27)
                value = None if x is None else _join_value(t.spec, c.key, left, right)
            else:
                if y is None:  # y is A's latest value here
                    return []
                value = _join_value(t.spec, c.key, left, right)
        elif kind == "outer":
            if x is None and c.old is None and y is None:
                return []  # KTableKTableOuterJoin: null -> null with no other value (rule 27)
            value = None if (x is None and y is None) else _join_value(t.spec, c.key, left, right)
        else:
            raise AssertionError(kind)
        return [(c.key, value, self._floor(t, c.key, c.ts, y_ts))]

    def _fk_join(self, t: Derived, source: str, c: Change) -> list[tuple[str, str | None, int]]:
        spec = t.spec["fk_join"]
        kind = spec["type"]
        assert kind in ("inner", "left"), kind
        fk_expr = spec["foreign_key"]
        a_table = self.tables_by_name[spec["left"]]
        b_table = self.tables_by_name[spec["right"]]
        if self.kind[source] == "versioned" and not c.in_order:
            return []  # rule 16: out-of-order records of a versioned input emit nothing
        if source == spec["left"]:
            # Kafka's SubscriptionSendProcessor instructions, decided by the old and new foreign
            # keys only (rule 27): it cannot know whether the old row had a result.
            k, a = c.key, c.new
            old_fk = None if c.old is None else _key_of(fk_expr, k, c.old)
            new_fk = None if a is None else _key_of(fk_expr, k, a)

            def respond(fk: str | None, value: str | None, propagate_null: bool) -> list[tuple[str, str | None, int]]:
                """The response for a subscription of ``value`` to ``fk`` (Kafka's instructions
                PROPAGATE_NULL_IF_NO_FK_VAL_AVAILABLE / PROPAGATE_ONLY_IF_FK_VAL_AVAILABLE)."""
                b_found = None if fk is None else b_table.latest(fk)
                stamp = self._floor(t, k, c.ts, None if b_found is None else b_found[1])
                if value is None:
                    return [(k, None, stamp)]
                if b_found is not None:
                    return [(k, _join_value(t.spec, k, value, b_found[0]), stamp)]
                if kind == "left":
                    return [(k, _join_value(t.spec, k, value, None), stamp)]
                return [(k, None, stamp)] if propagate_null else []

            if kind == "left":
                return [] if c.old is None and a is None else respond(new_fk, a, True)
            if a is None or new_fk is None:  # deleted, or lost its foreign key: DELETE_KEY_AND_PROPAGATE
                return [] if old_fk is None else respond(old_fk, None, True)
            return respond(new_fk, a, old_fk is not None and old_fk != new_fk)
        # a change of the right table (key f, value b): re-join every left record pointing at f
        f, b = c.key, c.new
        out: list[tuple[str, str | None, int]] = []
        for k in a_table.keys():  # ascending key order
            a_found = a_table.latest(k)
            if a_found is None or _key_of(fk_expr, k, a_found[0]) != f:
                continue
            a = a_found[0]  # Kafka stamps the result with the right change's timestamp
            if kind == "inner" and b is None:
                out.append((k, None, self._floor(t, k, c.ts)))
            else:
                out.append((k, _join_value(t.spec, k, a, b), self._floor(t, k, c.ts)))
        return out

    def _aggregate(self, t: Derived, source: str, c: Change) -> list[tuple[str, str | None, int]]:
        return [self._update_group(t, group, c, subtract, add) for group, subtract, add in self._route(t, source, c)]

    def _route(self, t: Derived, source: str, c: Change) -> list[tuple[str, str | None, str | None]]:
        """The group updates (group, value to subtract, value to add) an input change makes."""
        if self.kind[source] == "versioned" and not c.in_order:
            return []  # rule 17: out-of-order records of a versioned input are ignored entirely
        group_expr = t.spec["group_by"]
        g_old = None if c.old is None else _key_of(group_expr, c.key, c.old)
        g_new = None if c.new is None else _key_of(group_expr, c.key, c.new)
        if g_old is not None and g_old == g_new:  # KIP-904: subtract then add, one atomic update
            return [(g_old, c.old, c.new)]
        out: list[tuple[str, str | None, str | None]] = []
        if g_old is not None:
            out.append((g_old, c.old, None))
        if g_new is not None:
            out.append((g_new, None, c.new))
        return out

    def _update_group(
        self, t: Derived, group: str, c: Change, subtract: str | None, add: str | None
    ) -> tuple[str, str | None, int]:
        if "reduce" in t.spec or "init" in t.spec.get("aggregate", {}):
            return self._update_custom(t, group, c, subtract, add)
        aggregate = t.spec["aggregate"]
        table = self._out(t)
        count: int = 0
        total: int | Decimal = 0
        current = table.latest(group)  # the aggregate's state is its own store
        if current is not None:
            state = parse_value(current[0])
            count = state.get("count", 0)
            total = state.get("sum", 0)
        with decimal.localcontext() as exact:
            exact.prec = 1000  # sum is exact (far beyond any real value)
            if subtract is not None:
                count -= 1
                if "sum" in aggregate:
                    n = _evaluate(aggregate["sum"], c.key, subtract)
                    if _is_number(n):  # sum ignores null and non-numeric inputs
                        total -= n
            if add is not None:
                count += 1
                if "sum" in aggregate:
                    n = _evaluate(aggregate["sum"], c.key, add)
                    if _is_number(n):
                        total += n
        value: dict[str, Any] = {}
        if aggregate.get("count"):
            value["count"] = count
        if "sum" in aggregate:
            value["sum"] = total
        stamps = [s for s in (c.ts, table.prev_ts(group)) if s is not None]
        return (group, render_json(value), max(stamps))

    def _update_custom(
        self, t: Derived, group: str, c: Change, subtract: str | None, add: str | None
    ) -> tuple[str, str | None, int]:
        """Kafka's KTableAggregate.process / KTableReduce.process, step by step: the old aggregate
        is the group's latest value in the output store (null when none or a tombstone)."""
        spec = t.spec.get("reduce") or t.spec["aggregate"]
        table = self._out(t)
        current = table.latest(group)
        old_agg = None if current is None or current[0] is None else parse_value(current[0])
        if subtract is not None and old_agg is not None:
            intermediate = parse_expression(spec["subtract"]).evaluate(group, parse_value(subtract), old_agg)
        else:
            intermediate = old_agg
        if add is None:
            new_agg = intermediate
        elif intermediate is None and "init" not in spec:
            stamps = [s for s in (c.ts, table.prev_ts(group)) if s is not None]
            return (group, add, max(stamps))  # reduce: a group's first value is its aggregate, as it is
        else:
            start = intermediate if intermediate is not None else parse_expression(spec["init"]).evaluate(group, None)
            new_agg = parse_expression(spec["add"]).evaluate(group, parse_value(add), start)
        stamps = [s for s in (c.ts, table.prev_ts(group)) if s is not None]
        return (group, None if new_agg is None else render_json(new_agg), max(stamps))

    # ------------------------------------------------------------------ results
    def results(self) -> dict[str, TableResult]:
        out: dict[str, TableResult] = {}
        for t in self.derived:
            counts = {"emitted": t.emitted, "accepted_latest": 0, "accepted_out_of_order": 0, "tombstones": 0,
                      "late": 0}
            versions: Versions = {}
            if t.table is not None:
                counts["accepted_latest"] = t.table.counts.accepted_latest
                counts["accepted_out_of_order"] = t.table.counts.accepted_out_of_order
                counts["tombstones"] = t.table.counts.tombstones
                counts["late"] = t.table.counts.rejected["late"]
                versions = t.table.dump()
            out[t.name] = TableResult(list(t.emissions), versions, list(t.records), counts)
        return out


def run_pipeline(
    inputs: list[InputDef], tables: list[dict[str, Any]], runs: list[dict[str, list[Rec]]]
) -> dict[str, TableResult]:
    """Run every run in order through the pipeline; return each derived table's result."""
    pipeline = Pipeline(inputs, tables)
    for records in runs:
        pipeline.process_run(records)
    return pipeline.results()


def _whole_stores(inputs: list[InputDef], tables: list[dict[str, Any]]) -> tuple[list[str], list[dict[str, Any]]]:
    """With several partitions, the source stores each partition reads whole (docs/semantics.md,
    rule 23): the right inputs of foreign-key joins, which read them as ``<name>*`` (an input of
    their own right after ``<name>``, every partition's records in the store's own order)."""
    sources = {d.name for d in inputs if d.kind != "stream"}
    whole = list(dict.fromkeys(spec["fk_join"]["right"] for spec in tables
                               if "fk_join" in spec and spec["fk_join"]["right"] in sources))
    renamed = [{**spec, "fk_join": {**spec["fk_join"], "right": spec["fk_join"]["right"] + "*"}}
               if "fk_join" in spec and spec["fk_join"]["right"] in whole else spec for spec in tables]
    return whole, renamed


def _partition_inputs(inputs: list[InputDef], whole: list[str]) -> list[InputDef]:
    """One partition's inputs: each with one partition, then a store read whole with its own."""
    out = []
    for d in inputs:
        out.append(replace(d, partitions=1))
        if d.name in whole:
            out.append(replace(d, name=d.name + "*"))
    return out


def _partition_run(run: dict[str, list[Rec]], p: int, kinds: dict[str, str], whole: list[str],
                   stream_partition: Callable[[str], int]) -> dict[str, list[Rec]]:
    """One partition's records of a run: its own of every input, every record of a store read whole."""
    out = {name: [replace(r, partition=0) for r in recs
                  if (stream_partition(r.key) if kinds[name] == "stream" else r.partition) == p]
           for name, recs in run.items()}
    for name in whole:
        out[name + "*"] = list(run.get(name, []))
    return out


def run_partitioned(inputs: list[InputDef], tables: list[dict[str, Any]], runs: list[dict[str, list[Rec]]],
                    partitions: int, stream_partition: Callable[[str], int]) -> dict[str, TableResult]:
    """docs/semantics.md rule 23 with ``partitions`` partitions (a pipeline without re-keying
    tables over co-partitioned stores): the pipeline runs once per partition, over that
    partition's records alone (a store record's ``partition``, a stream record's
    ``stream_partition(key)``), as Kafka Streams runs one task per partition, a foreign-key
    join's right store read whole by each (``_whole_stores``); the results are combined:
    versions by key (a key lives in one partition), emissions run by run in partition order,
    counts summed. A stream output's records are its emissions."""
    per: list[dict[str, TableResult]] = []
    kinds = {d.name: d.kind for d in inputs}
    whole, renamed = _whole_stores(inputs, tables)
    for p in range(partitions):
        part_runs = [_partition_run(run, p, kinds, whole, stream_partition) for run in runs]
        per.append(run_pipeline(_partition_inputs(inputs, whole), renamed, part_runs))
    out: dict[str, TableResult] = {}
    for name in per[0]:
        emissions = [e for run in range(1, len(runs) + 1) for result in per for e in result[name].emissions
                     if e.run == run]
        versions: Versions = {}
        counts = dict.fromkeys(per[0][name].counts, 0)
        for result in per:
            versions.update(result[name].versions)
            for field_name, value in result[name].counts.items():
                counts[field_name] += value
        records = [(e.key, e.value, e.timestamp) for e in emissions] if per[0][name].records or any(
            r[name].records for r in per) else []
        out[name] = TableResult(emissions, versions, records, counts)
    return out


def run_repartitioned(inputs: list[InputDef], tables: list[dict[str, Any]], runs: list[dict[str, list[Rec]]],
                      partitions: int, stream_partition: Callable[[str], int],
                      group_partition: Callable[[str], int]) -> dict[str, TableResult]:
    """docs/semantics.md rule 23 with ``partitions`` partitions and group-by aggregates, as Kafka
    Streams runs them around a repartition topic: per run, each input partition's pipeline runs
    over that partition's records (as ``run_partitioned``) with every aggregate only routing
    its input's changes to group updates; then the pipeline of each group partition
    (``group_partition(group)``) applies the updates of its groups, merged from the input
    partitions by head timestamp, ties to the lower input partition, and propagates them to the
    tables that read the aggregate. The source inputs those tables read (an aggregate's *own*
    inputs) are processed there, not in the first pipelines: the group partition's records of
    them are merged with the updates by head timestamp, ties to the records (in declaration
    order), then to the updates. A group-by after a group-by routes its input's changes in the
    first one's group partitions, and applies them, merged the same way, once those are done.
    Results combine as ``run_partitioned``'s; a table comes from the pipelines that compute it
    (the aggregates and the tables after them: the group partitions')."""
    def ins(spec: dict[str, Any]) -> list[str]:
        return [spec.get("from")] + [spec[op][side] for op in ("join", "fk_join", "stream_join") if op in spec
                                     for side in ("left", "right", "stream", "table") if side in spec[op]]

    aggregates = [spec["name"] for spec in tables if "group_by" in spec]
    groups: dict[str, set[str]] = {}  # an aggregate and the tables after it, up to the next group-by
    nested: set[str] = set()  # group-bys after a group-by: their updates come from its pipelines
    for name in aggregates:
        groups[name] = {name}
        for spec in tables:
            if spec["name"] != name and any(i in groups[name] for i in ins(spec)):
                if "group_by" in spec:
                    nested.add(spec["name"])
                else:
                    groups[name].add(spec["name"])
    after: set[str] = set().union(*groups.values()) if groups else set()
    sources = [d.name for d in inputs]
    own = {name: [s for s in sources if any(s in ins(spec) for spec in tables if spec["name"] in groups[name] - {name})]
           for name in aggregates}
    owned = {s for names in own.values() for s in names}
    kinds = {d.name: d.kind for d in inputs}

    def part(name: str, recs: list[Rec], p: int) -> list[Rec]:
        return [replace(r, partition=0) for r in recs
                if (stream_partition(r.key) if kinds[name] == "stream" else r.partition) == p]

    whole, renamed = _whole_stores(inputs, tables)
    single = _partition_inputs(inputs, whole)
    first = [Pipeline(single, renamed) for _ in range(partitions)]
    second = [Pipeline(single, renamed) for _ in range(partitions)]
    for pipeline in first:
        pipeline.routed = {name: [] for name in aggregates if name not in nested}
    for pipeline in second:
        pipeline.routed = {name: [] for name in nested}
    for run in runs:
        for p, pipeline in enumerate(first):
            pipeline.process_run(_partition_run({name: recs for name, recs in run.items() if name not in owned},
                                                p, kinds, whole, stream_partition))
        for pipeline in second:
            pipeline.run += 1
            pipeline.sequence = {}
            for routed in pipeline.routed.values():
                routed.clear()
        for name in aggregates:  # in file order: a group-by's updates are all made before its own pass
            upstreams = second if name in nested else first
            for q, pipeline in enumerate(second):
                # the streams merged: own inputs (declaration order), then updates by input partition
                records: list[list[Any]] = [part(s, run.get(s, []), q) for s in own[name]]
                updates: list[list[Any]] = [[u for u in upstream.routed[name] if group_partition(u[0]) == q]
                                            for upstream in upstreams]
                streams = records + updates
                position = [0] * len(streams)
                while True:
                    heads = [(streams[i][position[i]].timestamp if i < len(records) else streams[i][position[i]][1].ts,
                              i) for i in range(len(streams)) if position[i] < len(streams[i])]
                    if not heads:
                        break
                    _, i = min(heads)
                    item = streams[i][position[i]]
                    position[i] += 1
                    if i < len(records):
                        pipeline._source_record(next(d for d in single if d.name == own[name][i]), item)
                    else:
                        group, change, subtract, add = item
                        pipeline.apply_group_update(name, group, change, subtract, add)
    out: dict[str, TableResult] = {}
    for spec in tables:
        name = spec["name"]
        per = [pipeline.results()[name] for pipeline in (second if name in after else first)]
        emissions = [e for run in range(1, len(runs) + 1) for result in per for e in result.emissions if e.run == run]
        versions: Versions = {}
        counts = dict.fromkeys(per[0].counts, 0)
        for result in per:
            versions.update(result.versions)
            for field_name, value in result.counts.items():
                counts[field_name] += value
        records = [(e.key, e.value, e.timestamp) for e in emissions] if any(r.records for r in per) else []
        out[name] = TableResult(emissions, versions, records, counts)
    return out
