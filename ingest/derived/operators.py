"""The operators of derived tables, one record at a time (docs/semantics.md, rules 13-18 and 23-30;
docs/derived-tables.md).

Each operator turns one input change (table inputs) or one stream record (stream inputs) into
the results it emits, reading the other side's table state as it stands at that point of the
merge order. Emitted results are applied to the derived table's own store by the topology.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any, NamedTuple

from versiq.ingest.derived.expressions import is_true, key_string, parse_value, render_json
from versiq.ingest.derived.spec import TableSpec
from versiq.ingest.derived.state import Change, TableState
from versiq.ingest.derived.subscriptions import Subscriptions


class StreamRecord(NamedTuple):
    key: str
    value: str | None
    timestamp: int


class Emit(NamedTuple):
    key: str
    value: str | None  # None: a tombstone
    timestamp: int


class GroupUpdate(NamedTuple):
    """One update of an aggregate's group: the input ``key``'s ``old`` value leaves the group
    (None: nothing leaves) and its ``new`` value joins it (None: nothing joins), at
    ``timestamp``. ``removed`` and ``added`` are those values' parts the aggregate needs (their
    amounts, or the parsed values of a custom aggregate), computed once by ``Aggregate.route``."""

    group: str
    key: str
    old: str | None
    new: str | None
    timestamp: int
    removed: Any
    added: Any


class Operator:
    """Base: the derived table ``own`` (None for a stream output) and its input tables by side."""

    def __init__(self, spec: TableSpec, inputs: list[TableState | None], own: TableState | None) -> None:
        self.spec = spec
        self.inputs = inputs
        self.own = own

    def on_change(self, side: int, change: Change) -> list[Emit]:
        return []

    def on_record(self, side: int, record: StreamRecord) -> list[Emit]:
        return []

    def _prev(self, key: str) -> int | None:
        """The timestamp of the derived table's current latest version of ``key`` (or None)."""
        if self.own is None:
            return None
        newest = self.own.latest(key)
        return None if newest is None else newest[0]

    def _stamp(self, key: str, stamp: int, other: int | None = None) -> int:
        """A join result's timestamp: the max of the given ones and the key's previous result."""
        if other is not None and other > stamp:
            stamp = other
        previous = self._prev(key)
        return stamp if previous is None or stamp >= previous else previous

    def _join(self, key: str, left: str | None, right: str | None) -> str:
        """The joined value: ``{"left":L,"right":R}`` verbatim, or the ``select`` projection."""
        if self.spec.select is None:
            return '{"left":' + (left if left is not None else "null") + ',"right":' + \
                (right if right is not None else "null") + "}"
        joined = {"left": parse_value(left), "right": parse_value(right)}
        return render_json({name: expr.evaluate(key, joined) for name, expr in self.spec.select})


class Filter(Operator):
    """Rule 13: every change is forwarded; failing values become tombstones. A versioned input
    forwards every tombstone; a non-versioned one drops a tombstone when the filter's own table
    has no current value for the key (Kafka's KTableFilter reads its materialized result)."""

    def on_change(self, side: int, change: Change) -> list[Emit]:
        assert self.spec.filter is not None
        new = change.new
        if new is not None and is_true(self.spec.filter.evaluate(change.key, parse_value(new))):
            return [Emit(change.key, new, change.timestamp)]
        table, own = self.inputs[0], self.own
        assert table is not None and own is not None
        if not table.versioned and own.latest_value(change.key) is None:
            return []  # Kafka's KTableFilter: nothing to delete in the filter's own table
        return [Emit(change.key, None, change.timestamp)]


class Copy(Operator):
    """``from: table`` without a filter: every change, as it is."""

    def on_change(self, side: int, change: Change) -> list[Emit]:
        return [Emit(change.key, change.new, change.timestamp)]


class ToTable(Operator):
    """``from: stream``: each record is a put (null = delete); a filter drops failing records."""

    def on_record(self, side: int, record: StreamRecord) -> list[Emit]:
        if self.spec.filter is not None and not is_true(
                self.spec.filter.evaluate(record.key, parse_value(record.value))):
            return []
        return [Emit(record.key, record.value, record.timestamp)]


class StreamTableJoin(Operator):
    """Rule 14: each stream record joins the table as of its timestamp (KIP-914)."""

    def on_record(self, side: int, record: StreamRecord) -> list[Emit]:
        if record.value is None:
            return []
        table = self.inputs[1]
        assert table is not None
        found = table.as_of(record.key, record.timestamp)
        if found is None and self.spec.join_type == "inner":
            return []
        right = None if found is None else found[0]
        return [Emit(record.key, self._join(record.key, record.value, right), record.timestamp)]


class TableTableJoin(Operator):
    """Rule 15: primary-key join; an out-of-order change of a versioned side emits nothing.

    What is emitted is exactly what Kafka's join processors forward (rule 27): the inner join
    answers a change only when the other side has a value (a tombstone when this side's new
    value is null); a left or outer join skips a change only when this side's old and new
    values and the other side's value are all null; the right side of a left join answers only
    when the left side has a value."""

    def on_change(self, side: int, change: Change) -> list[Emit]:
        this, other = self.inputs[side], self.inputs[1 - side]
        assert this is not None and other is not None
        if this.versioned and not change.in_order:
            return []
        found = other.latest_value(change.key)
        y = None if found is None else found[0]
        y_ts = None if found is None else found[1]
        x = change.new
        left, right = (x, y) if side == 0 else (y, x)
        kind = self.spec.join_type
        value: str | None
        if kind == "inner" or (kind == "left" and side == 1):
            if y is None:
                return []
            value = None if x is None and kind == "inner" else self._join(change.key, left, right)
        else:  # the left side of a left join, either side of an outer join
            if y is None and x is None and change.old is None:
                return []  # null -> null with nothing on the other side
            if kind == "left":
                value = None if x is None else self._join(change.key, x, y)
            else:
                value = None if x is None and y is None else self._join(change.key, left, right)
        return [Emit(change.key, value, self._stamp(change.key, change.timestamp, y_ts))]


class ForeignKeyJoin(Operator):
    """Rule 16 (KIP-213): left updates join the right value of their foreign key; right updates
    re-join every left key currently pointing at them. Computed synchronously from current
    values, so a result for a superseded left value is never emitted; what is emitted, and when
    a tombstone is, follows Kafka's subscription instructions exactly (``_left_change``).

    In one partition ``partition`` of several (docs/semantics.md, rule 23), the right input is
    the whole right table, read by every partition, and a right update re-joins only the left
    keys of this partition (each left key is in one partition, which answers it)."""

    def __init__(self, spec: TableSpec, inputs: list[TableState | None], own: TableState | None) -> None:
        super().__init__(spec, inputs, own)
        self._fks: dict[str, tuple[str, str | None]] = {}
        #: The partition whose left keys this join answers (None: every left key, one partition).
        self.partition: int | None = None
        reader = None if own is None else own.reader
        snapshot = reader is not None and reader.version is not None
        self.subscriptions = Subscriptions(None if reader is None else reader.path,
                                           reader.state.run if snapshot and reader is not None else None,
                                           self._pointers)

    def _fk(self, key: str, value: str | None) -> str | None:
        """The foreign key of a left value. The last one computed for each left key is kept with
        the value text it came from, so a key's change does not parse again the old value (the
        text a change's ``old`` is, that its previous change computed as ``new``)."""
        assert self.spec.foreign_key is not None
        if value is None:
            return None
        known = self._fks.get(key)
        if known is not None and known[0] is value:
            return known[1]
        fk = key_string(self.spec.foreign_key.evaluate(key, parse_value(value)))
        self._fks[key] = (value, fk)
        return fk

    def _pointers(self) -> list[tuple[str, str]]:
        """Every (left key, foreign key) of the whole left table (a table without a persisted
        index: ``Subscriptions``)."""
        left = self.inputs[0]
        assert left is not None
        out = []
        for key in left.keys():
            current = left.latest_value(key)
            fk = None if current is None else self._fk(key, current[0])
            if fk is not None:
                out.append((key, fk))
        return out

    def _subscribers(self, foreign_key: str) -> list[str]:
        return self.subscriptions.subscribers(foreign_key)

    def prefetch(self, left_keys: set[str], right_keys: set[str],
                 left_records: list[tuple[str, str | None]]) -> set[str]:
        """Bulk-load what a batch will read: the right rows of the left records' foreign keys
        and, when right keys change, the left rows and result rows of every left key pointing at
        them (``Subscriptions``). Returns the result keys the batch may touch."""
        left, right = self.inputs
        assert left is not None and right is not None
        if not right.fully_loaded:
            fks = {fk for key, value in left_records if (fk := self._fk(key, value)) is not None}
            for key in left_keys:
                current = left.latest_value(key)
                fk = None if current is None else self._fk(key, current[0])
                if fk is not None:
                    fks.add(fk)
            right.prefetch(fks)
        touched = set(left_keys)
        self.subscriptions.load(right_keys)
        for foreign_key in right_keys:
            touched.update(self._subscribers(foreign_key))
        left.prefetch(touched)  # the current values of the left rows a right change re-joins
        if self.partition is not None:  # another partition's left keys are answered there
            touched = {k for k in touched if left.partition.get(k, self.partition) == self.partition}
        return touched

    def on_change(self, side: int, change: Change) -> list[Emit]:
        left, right = self.inputs
        assert left is not None and right is not None
        if side == 0:
            if left.versioned and not change.in_order:
                return []
            old_fk, new_fk = self._fk(change.key, change.old), self._fk(change.key, change.new)
            if old_fk != new_fk:
                self.subscriptions.moved(change.key, new_fk)
            return self._left_change(change, old_fk, new_fk)
        if right.versioned and not change.in_order:
            return []
        keys = self._subscribers(change.key)
        if self.partition is not None:
            left.prefetch(keys)
            keys = [k for k in keys if left.partition.get(k) == self.partition]
        if self.own is not None:
            self.own.prefetch(keys)
        out = []
        for key in keys:
            current = left.latest_value(key)
            if current is None:
                continue
            if change.new is None and self.spec.join_type == "inner":
                value = None
            else:
                value = self._join(key, current[0], change.new)
            # Kafka stamps a result caused by a right-side change with that change's timestamp
            out.append(Emit(key, value, self._stamp(key, change.timestamp)))
        return out

    def _left_change(self, change: Change, old_fk: str | None, new_fk: str | None) -> list[Emit]:
        """A left change, as Kafka's subscription protocol answers it (KIP-213; rules 16, 27, 28).

        Kafka cannot see whether a left row had a result, so its instructions depend only on the
        old and new foreign keys: a result (or a tombstone) is emitted whenever the old row had
        a foreign key, and a row that had none emits only when it finds a match (inner join). A
        left join answers every change except deleting a row that does not exist. The result is
        stamped with the largest of the change's timestamp and the right value's, when there is
        one (and the key's previous result, rule 26)."""
        right = self.inputs[1]
        assert right is not None
        key, new = change.key, change.new

        def emit(foreign_key: str | None, joined: bool, propagate_null: bool = True) -> list[Emit]:
            """Kafka's response to one instruction: ``propagate_null`` False is its
            PROPAGATE_ONLY_IF_FK_VAL_AVAILABLE (an inner join without a match emits nothing)."""
            found = None if foreign_key is None else right.latest_value(foreign_key)
            if found is None and joined and not propagate_null and self.spec.join_type == "inner":
                return []
            stamp = self._stamp(key, change.timestamp, None if found is None else found[1])
            if new is None or not joined or (found is None and self.spec.join_type == "inner"):
                return [Emit(key, None, stamp)]
            return [Emit(key, self._join(key, new, None if found is None else found[0]), stamp)]

        if self.spec.join_type == "left":
            if change.old is None and new is None:
                return []  # deleting a row that does not exist
            return emit(new_fk, True)
        if new is None or new_fk is None:  # deleted, or no foreign key any more
            return [] if old_fk is None else emit(old_fk, False)
        # a moved foreign key must retract the old result; a new or unchanged one answers only a match
        return emit(new_fk, True, propagate_null=old_fk is not None and old_fk != new_fk)


def _number(value: Any) -> int | Decimal | None:
    if isinstance(value, bool) or not isinstance(value, (int, Decimal)):
        return None
    return value


def _amounts_text(amounts: tuple[int | Decimal | None, ...]) -> str:
    """A value's amounts as text that ``_amounts_of`` reads back exactly (ints stay ints)."""
    return ",".join("n" if a is None else ("i" if a.__class__ is int else "d") + str(a) for a in amounts)


def _amounts_of(text: str) -> tuple[int | Decimal | None, ...]:
    """The amounts ``_amounts_text`` wrote."""
    return tuple(None if part == "n" else int(part[1:]) if part[0] == "i" else Decimal(part[1:])
                 for part in text.split(",")) if text else ()


#: Totals below this magnitude render as digits that parse back to the same int (``_current``).
_ROUND_TRIP = 10 ** 1000


class Aggregate(Operator):
    """Rule 17 (KIP-904): subtract the old value from its group and add the new one to its group,
    one atomic update when the group is the same; out-of-order changes of a versioned input
    are ignored. The aggregate's state is its own store's latest value per group.

    Two things computed are kept, each with the exact text it was computed from and used only
    while that very text object comes back, so they never change an answer: per input key, the
    group and amounts of its last value (a change's ``old`` is its previous change's ``new``),
    and per group, the totals of its last emitted aggregate when they are all ints (the
    aggregate's current value is the text emitted last, and an int renders as digits that parse
    back to the same int)."""

    def __init__(self, spec: TableSpec, inputs: list[TableState | None], own: TableState | None) -> None:
        super().__init__(spec, inputs, own)
        self._contributions: dict[str, tuple[str, str | None, tuple[int | Decimal | None, ...]]] = {}
        self._emitted: dict[str, tuple[str, dict[str, Any]]] = {}
        #: ``"name":`` of each aggregate, as ``render_json`` renders an object's member
        self._members = {name: render_json(name) + ":" for name, _ in spec.aggregates}

    def on_change(self, side: int, change: Change) -> list[Emit]:
        return [self.apply(update) for update in self.route(change)]

    def route(self, change: Change) -> list[GroupUpdate]:
        """The group updates an input change makes (Kafka's KTableRepartitionMap): nothing for an
        out-of-order change of a versioned input; one update when the old and new values are in
        the same group (KIP-904), else a subtraction from the old group, then an addition to the
        new one. A null group drops that side. The updates are keyed by group: with several
        partitions they go to the partition of their group (``derived.topology``)."""
        table = self.inputs[0]
        assert table is not None and self.spec.group_by is not None
        if table.versioned and not change.in_order:
            return []
        key, stamp = change.key, change.timestamp
        if self.spec.aggregator is not None:
            group_by = self.spec.group_by

            def group(value: str | None) -> tuple[str | None, Any]:
                if value is None:
                    return None, None
                parsed = parse_value(value)
                return key_string(group_by.evaluate(key, parsed)), parsed

            g_old, old = group(change.old)
            g_new, new = group(change.new)
        else:
            g_old, old = self._contribution(key, change.old)
            g_new, new = self._contribution(key, change.new)
        if g_old is not None and g_old == g_new:
            return [GroupUpdate(g_old, key, change.old, change.new, stamp, old, new)]
        out = []
        if g_old is not None:
            out.append(GroupUpdate(g_old, key, change.old, None, stamp, old, None))
        if g_new is not None:
            out.append(GroupUpdate(g_new, key, None, change.new, stamp, None, new))
        return out

    def shipped(self, update: GroupUpdate) -> tuple[str | None, str | None]:
        """What of an update's old and new values crosses a repartition (``regrouped`` reads it
        back): a custom aggregate's values as they are; a count's or sum's amounts only, as text
        (``_amounts_text``), so the group's partition does not parse the values again."""
        if self.spec.aggregator is not None:
            return update.old, update.new
        return (None if update.old is None else _amounts_text(update.removed),
                None if update.new is None else _amounts_text(update.added))

    def regrouped(self, group: str, key: str, old: str | None, new: str | None, timestamp: int) -> GroupUpdate:
        """A group update that crossed a repartition (``route``'s fields, ``old`` and ``new`` as
        ``shipped`` sent them), with its parts read back."""
        if self.spec.aggregator is not None:
            return GroupUpdate(group, key, old, new, timestamp, None if old is None else parse_value(old),
                               None if new is None else parse_value(new))
        return GroupUpdate(group, key, old, new, timestamp, None if old is None else _amounts_of(old),
                           None if new is None else _amounts_of(new))

    def apply(self, update: GroupUpdate) -> Emit:
        """One group's new aggregate after ``update``, stamped with the later of the update's
        timestamp and the group's last result."""
        if self.spec.aggregator is not None:
            return self._custom(update.timestamp, update.group, update.removed, update.added, update.new)
        return self._update(update.group, update.timestamp, update.removed, update.added)

    def _update(self, group_key: str, timestamp: int, removed: tuple[int | Decimal | None, ...] | None,
                added: tuple[int | Decimal | None, ...] | None) -> Emit:
        """One group's new aggregate: its current totals, minus the removed value's amounts, plus
        the added one's, stamped with the later of ``timestamp`` and the group's last result."""
        assert self.own is not None
        newest = self.own.latest(group_key)
        totals = self._current(group_key, None if newest is None else newest[1])
        if removed is not None:
            self._apply(totals, -1, removed)
        if added is not None:
            self._apply(totals, 1, added)
        parts = []
        exact = True
        for name, value in totals.items():
            if value.__class__ is int and -_ROUND_TRIP < value < _ROUND_TRIP:
                parts.append(self._members[name] + str(value))  # render_number of an int
            else:
                parts.append(self._members[name] + render_json(value))
                exact = False
        text = "{" + ",".join(parts) + "}"
        if exact:
            self._emitted[group_key] = (text, totals)
        else:
            self._emitted.pop(group_key, None)
        stamp = timestamp if newest is None or timestamp >= newest[0] else newest[0]
        return Emit(group_key, text, stamp)

    def _contribution(self, key: str, value: str | None) -> tuple[str | None, tuple[int | Decimal | None, ...]]:
        """A value's group and its amount for each aggregate (None for ``count``, or when the
        expression is not a number)."""
        if value is None:
            return None, ()
        known = self._contributions.get(key)
        if known is not None and known[0] is value:
            return known[1], known[2]
        assert self.spec.group_by is not None
        parsed = parse_value(value)
        group = key_string(self.spec.group_by.evaluate(key, parsed))
        amounts: tuple[int | Decimal | None, ...] = ()
        if group is not None:
            amounts = tuple(None if name == "count" or expr is None else _number(expr.evaluate(key, parsed))
                            for name, expr in self.spec.aggregates)
        self._contributions[key] = (value, group, amounts)
        return group, amounts

    def _custom(self, timestamp: int, group_key: str, removed: Any, added: Any, new_text: str | None) -> Emit:
        """Kafka's KTableAggregate / KTableReduce for one group: subtract the old value when the
        group has an aggregate, then add the new one (to ``init``, or as the first value of a
        reduce, when the group has none). A null aggregate deletes the group. A reduce's first
        value is kept verbatim, as Kafka passes it through; computed aggregates are rendered
        (numbers normalised)."""
        assert self.own is not None and self.spec.aggregator is not None
        aggregator = self.spec.aggregator
        found = self.own.latest_value(group_key)
        agg = None if found is None else parse_value(found[0])
        if removed is not None and agg is not None:
            agg = aggregator.subtract.evaluate(group_key, removed, agg)
        verbatim = None
        if added is not None:
            if agg is not None:
                agg = aggregator.add.evaluate(group_key, added, agg)
            elif aggregator.init is not None:
                agg = aggregator.add.evaluate(group_key, added, aggregator.init.evaluate(group_key, None))
            else:
                agg, verbatim = added, new_text
        value = verbatim if verbatim is not None else None if agg is None else render_json(agg)
        return Emit(group_key, value, self._stamp(group_key, timestamp))

    def _current(self, group_key: str, text: str | None) -> dict[str, Any]:
        """The totals of the group's current aggregate ``text`` (None: none, or a tombstone)."""
        if text is not None:
            emitted = self._emitted.get(group_key)
            if emitted is not None and emitted[0] is text:
                return dict(emitted[1])
        stored = parse_value(text) if text is not None else {}
        totals: dict[str, Any] = {}
        for name, _ in self.spec.aggregates:
            current = stored.get(name) if isinstance(stored, dict) else None
            totals[name] = _number(current) or 0
        return totals

    def _apply(self, totals: dict[str, Any], sign: int, amounts: tuple[int | Decimal | None, ...]) -> None:
        for (name, _), amount in zip(self.spec.aggregates, amounts, strict=True):
            if name == "count":
                totals[name] += sign
            elif amount is not None:
                totals[name] = totals[name] + amount if sign > 0 else totals[name] - amount




OPERATORS: dict[str, Callable[[TableSpec, list[TableState | None], TableState | None], Operator]] = {
    "filter": Filter,
    "copy": Copy,
    "to_table": ToTable,
    "stream_join": StreamTableJoin,
    "join": TableTableJoin,
    "fk_join": ForeignKeyJoin,
    "aggregate": Aggregate,
}
