"""One synchronous topology: depth-first propagation (docs/semantics.md, rules 13-18 and 23-30).

The topology is given its source records one at a time, in the merge order of rule 23 (among
the inputs with records left, the head record with the smallest timestamp goes next, ties to
the input declared first; ``derived.tasks.PartitionRun``). Each source record is applied to its
table and every resulting change or stream record goes depth-first through the derived tables
that read it, in file order; every result a derived table emits is applied to its own store at
once and its change propagates before the next result, exactly as Kafka Streams forwards within
one task.

With several partitions, a group-by aggregate's input changes cross a *repartition*, as Kafka's
repartition topics carry them: the topology of an input partition routes them to group updates
(``repartitioned``) instead of applying them, and the topology of the group's partition applies
them (``update``, in merge order with that partition's records of the stage's own inputs) and
propagates the aggregate's changes to the tables that read it.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import NamedTuple

from versiq.ingest.derived.operators import (
    OPERATORS,
    Aggregate,
    Emit,
    ForeignKeyJoin,
    GroupUpdate,
    Operator,
    StreamRecord,
)
from versiq.ingest.derived.spec import TableSpec
from versiq.ingest.derived.state import Change, TableState


def whole_name(name: str) -> str:
    """The name under which a partition reads source store ``name`` whole (every partition's
    records and keys), for its foreign-key joins (``Topology``'s ``whole``)."""
    return name + "*"


class SourceRecord(NamedTuple):
    key: str
    value: str | None
    timestamp: int
    partition: int = 0


class Emission(NamedTuple):
    sequence: int
    key: str
    value: str | None
    timestamp: int
    cause: str


@dataclass
class TableCounts:
    emitted: int = 0
    accepted_latest: int = 0
    accepted_out_of_order: int = 0
    replaced_same_timestamp: int = 0
    tombstones: int = 0
    late: int = 0


@dataclass
class DerivedNode:
    spec: TableSpec
    operator: Operator
    own: TableState | None  # None: a stream output
    #: The states it reads, by side: its inputs, a store read whole by its ``whole_name``.
    inputs: list[str] = field(default_factory=list)
    emissions: list[Emission] = field(default_factory=list)
    late: list[Emission] = field(default_factory=list)
    counts: TableCounts = field(default_factory=TableCounts)


class Topology:
    """The derived tables of one pass over the tables states they read and write."""

    def __init__(self, tables: list[TableSpec], states: dict[str, TableState], partition: int = 0,
                 repartitioned: Collection[str] = (), whole: Collection[str] = ()) -> None:
        """``partition``: the partition of the pass this topology processes; the derived tables'
        results are put in it (their stream time is per partition, as a task's store's is).
        ``repartitioned``: aggregates whose input changes are only routed here, to
        ``self.updates`` in emission order (their own state is not needed). ``whole``: source
        stores read whole by this partition's foreign-key joins (one of several partitions): a
        foreign-key join whose right input is one reads it as ``whole_name(input)``, an input of
        its own with every partition's records (``states`` holds its state), and answers only
        this partition's left keys."""
        self.states = states
        self.partition = partition
        self.nodes: dict[str, DerivedNode] = {}
        self.dependents: dict[str, list[tuple[DerivedNode, int]]] = {}
        self.updates: dict[str, list[GroupUpdate]] = {name: [] for name in repartitioned}
        #: A store read whole is, as the cause of an emission, the store.
        self._causes = {whole_name(name): name for name in whole}
        for spec in tables:
            names = [whole_name(name) if spec.op == "fk_join" and side == 1 and name in whole else name
                     for side, name in enumerate(spec.inputs)]
            inputs = [states.get(name) for name in names]
            own = None if spec.is_stream or spec.name in self.updates else states[spec.name]
            operator = OPERATORS[spec.op](spec, inputs, own)
            if isinstance(operator, ForeignKeyJoin) and names[1] != spec.inputs[1]:
                operator.partition = partition
            node = DerivedNode(spec, operator, own, names)
            self.nodes[spec.name] = node
            for side, name in enumerate(names):
                self.dependents.setdefault(name, []).append((node, side))

    # -- feeding ----------------------------------------------------------------------------
    def record(self, name: str, is_stream: bool, key: str, value: str | None, timestamp: int, partition: int) -> None:
        """Apply the next source record of the merge (of input ``name``, in ``partition``) and
        propagate what it changes."""
        if is_stream:
            self._stream_record(name, StreamRecord(key, value, timestamp))
            return
        change = self.states[name].put(key, value, timestamp, partition).change
        if change is not None:
            self._changed(name, change)

    def update(self, name: str, update: GroupUpdate) -> None:
        """Apply the next group update of aggregate ``name`` that crossed a repartition (a stage
        after it) and propagate the aggregate's change."""
        node = self.nodes[name]
        assert isinstance(node.operator, Aggregate)
        self._emit(node, node.operator.apply(update), node.spec.inputs[0])

    # -- propagation ------------------------------------------------------------------------
    def _changed(self, name: str, change: Change) -> None:
        for node, side in self.dependents.get(name, ()):
            routed = self.updates.get(node.spec.name)
            if routed is not None:
                assert isinstance(node.operator, Aggregate)
                routed.extend(node.operator.route(change))
                continue
            for emit in node.operator.on_change(side, change):
                self._emit(node, emit, self._causes.get(name, name))

    def _stream_record(self, name: str, record: StreamRecord) -> None:
        for node, side in self.dependents.get(name, ()):
            for emit in node.operator.on_record(side, record):
                self._emit(node, emit, name)

    def _emit(self, node: DerivedNode, emit: Emit, cause: str) -> None:
        counts = node.counts
        counts.emitted += 1
        emission = Emission(counts.emitted, emit.key, emit.value, emit.timestamp, cause)
        node.emissions.append(emission)
        if node.own is None:
            self._stream_record(node.spec.name, StreamRecord(emit.key, emit.value, emit.timestamp))
            return
        result = node.own.put(emit.key, emit.value, emit.timestamp, self.partition)
        if result.change is None:
            counts.late += 1
            node.late.append(emission)
            return
        if result.latest:
            counts.accepted_latest += 1
        else:
            counts.accepted_out_of_order += 1
        if result.replaced:
            counts.replaced_same_timestamp += 1
        if emit.value is None:
            counts.tombstones += 1
        self._changed(node.spec.name, result.change)
