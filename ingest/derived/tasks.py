"""One partition of a derived pass: the work a Spark task does (docs/semantics.md, rule 23).

A derived pass (``derive``) is cut into its *partitions*, as Kafka Streams cuts a topology into
tasks: partition ``p`` of the pass holds partition ``p`` of each co-partitioned input, and its
records go through the whole record-at-a-time topology (``Topology``) over the state of its
own keys only, merged by head timestamp exactly as rule 23 says, restricted to that partition.
Nothing here talks to Spark: a ``PartitionRun`` is fed a partition's records in merge order,
a chunk at a time, and hands out its results as Arrow rows, whether it runs inside a Spark task
(``derived.job``) or anywhere else.

What one partition returns for each writer of the pass (``PartitionResult``): the rows its store
changed (or the stream output's records), its ``_emitted`` rows and its late results, with
*local* sequences (1, 2, ... within the partition); the job makes them one sequence per run
(partition order, then local order) before writing. The table's stream time in the partition
and its counts come back too, to be summed and committed by the driver.

**Repartitions.** A pass with several partitions whose topology has group-by aggregates runs in
*stages*, as Kafka Streams' sub-topologies around a repartition topic (``stages``): the first
stage runs everything up to the aggregates, in the input partitions, and routes each
aggregate's input changes to group updates (``PartitionResult.updates``); each aggregate then
has a stage of its own, in the partitions of its groups (a group's partition is its key's
default partition by the stores' partitioner, as Kafka's partitioner places a repartition
topic's records), that applies the updates and runs the tables that read the aggregate
(a ``PartitionRun`` of the stage). A group's partition merges the updates of every input partition by head
timestamp, ties to the lower input partition, each input partition's updates in their own order
(docs/semantics.md, rule 23): one of the interleavings Kafka's repartition topic can deliver,
made deterministic. The tables after an aggregate may also read source inputs of their own
(``own_inputs``: e.g. per-customer totals joined with the customers store, co-partitioned with
the groups), whose records the aggregate's stage reads instead of the first: their partition's
records and its updates are merged by head timestamp, ties to the records.

**Stores read whole.** A foreign-key join needs, for any left key, the right value of any
foreign key, which another partition may hold. Every partition of a pass with several reads the
join's right store whole (``whole_inputs``: all its records of the pass, as an input of its own,
``whole_name``), as Kafka Streams reads a global table, and the join answers only the left keys
of its partition.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa

from versiq.ingest.derived.expressions import key_string, parse_value
from versiq.ingest.derived.operators import Aggregate, ForeignKeyJoin
from versiq.ingest.derived.spec import TableSpec
from versiq.ingest.derived.state import SnapshotReader, TableState
from versiq.ingest.derived.topology import DerivedNode, Emission, SourceRecord, Topology, whole_name
from versiq.layout import EMITTED_SCHEMA, MURMUR2, REJECTED_SCHEMA, STREAM_SCHEMA, Partitioning, bucket_of


@dataclass(frozen=True)
class TableRead:
    """Where one table of the pass is read from: a source store, or a derived table of the pass,
    at the snapshot the pass starts from (``version`` None: no snapshot yet)."""

    name: str
    path: str
    version: int | None
    kind: str
    history_retention_ms: int
    buckets: int
    #: Stream-time partitions of a source store; 1 for a derived table.
    partitions: int = 1

    def reader(self) -> SnapshotReader:
        return SnapshotReader(self.path, self.version, self.kind, self.buckets, self.history_retention_ms)


@dataclass(frozen=True)
class PassWork:
    """Everything a partition of a pass needs, small enough to ship to every task."""

    #: The tables of the pass, in pipeline file order (writers and the upstream tables they read).
    tables: tuple[TableSpec, ...]
    #: The tables whose results are written (the others are recomputed for their readers only).
    writers: tuple[str, ...]
    #: Source stores and derived tables of the pass (not streams), by name.
    reads: tuple[TableRead, ...]
    #: The pass's source inputs in declaration order, as the merge needs them: (name, is_stream).
    inputs: tuple[tuple[str, bool], ...]
    #: The run each writer commits.
    runs: tuple[tuple[str, int], ...]
    #: How many partitions the pass has (1: every record in one partition).
    partitions: int = 1
    #: The stores' partitioner, which places stream records and groups (``layout.Partitioning``).
    partitioner: str = MURMUR2
    #: Aggregates whose input changes leave this stage as group updates (a repartition).
    repartitioned: tuple[str, ...] = ()
    #: The aggregate whose group updates are this stage's input ("": the source records).
    regrouped: str = ""

    def run_of(self, name: str) -> int:
        return dict(self.runs)[name]

    def spec(self, name: str) -> TableSpec:
        return next(t for t in self.tables if t.name == name)


@dataclass
class TableOutcome:
    """Part of one writer's results in one partition, as a ``PartitionRun`` hands them out."""

    #: A stream output's records, or the rows its store changed.
    rows: pa.Table | None = None
    emitted: pa.Table | None = None
    late: pa.Table | None = None
    #: A foreign-key join's moved pointers (``_subscriptions`` rows).
    subscriptions: pa.Table | None = None
    #: The table's statistics in this partition (its last part only): counts, stream time (None:
    #: it accepted nothing there, ever), how many rows, late results and pointers it handed out.
    stats: dict[str, Any] | None = None


@dataclass
class PartitionResult:
    partition: int
    tables: dict[str, TableOutcome] = field(default_factory=dict)
    #: The group updates each repartitioned aggregate's input made here, in emission order, as
    #: they cross the repartition: (group, input key, old, new, timestamp, merge key)
    #: (``Aggregate.shipped``; the merge key is the largest timestamp of the partition's updates
    #: for the same group partition up to this one, ``job.merge_key_sql``'s, which the stage
    #: that applies them sorts by).
    updates: dict[str, list[tuple[str, str, str | None, str | None, int, int]]] = field(default_factory=dict)
    #: How many of each aggregate's updates the partition handed out before these (their order).
    shipped_before: dict[str, int] = field(default_factory=dict)


def _regroups(spec: TableSpec) -> bool:
    """Whether a table is a group-by aggregate: its results are keyed by group, not by its
    input's key (in Kafka Streams, through a repartition topic)."""
    return spec.op == "aggregate" and spec.group_by is not None


def _after(tables: Iterable[TableSpec], aggregate: str) -> list[TableSpec]:
    """The sub-topology after an aggregate's repartition: the tables that read it, directly or
    not, in file order, up to the next group-by aggregates (included: they route their input's
    changes to a repartition of their own, the tables after them are theirs)."""
    found = {aggregate}
    out = []
    for spec in tables:
        if any(i in found for i in spec.inputs):
            out.append(spec)
            if not _regroups(spec):
                found.add(spec.name)
    return out


def own_inputs(tables: list[TableSpec], aggregate: str) -> tuple[str, ...]:
    """The source inputs an aggregate's stage reads itself: those read by the tables after the
    aggregate (a sub-topology with a second source, as Kafka's after a repartition topic, whose
    partitions are co-partitioned with it)."""
    derived = {t.name for t in tables}
    return tuple(dict.fromkeys(i for t in _after(tables, aggregate) if not _regroups(t)
                               for i in t.inputs if i not in derived))


def whole_inputs(work: PassWork) -> tuple[str, ...]:
    """The source stores every partition of a pass with several reads whole: the right inputs of
    its foreign-key joins (docs/semantics.md, rule 23), as Kafka Streams reads a global table."""
    if work.partitions == 1:
        return ()
    sources = {name for name, is_stream in work.inputs if not is_stream}
    return tuple(dict.fromkeys(t.inputs[1] for t in work.tables if t.op == "fk_join" and t.inputs[1] in sources))


def repartitionable(tables: list[TableSpec]) -> bool:
    """Whether a topology can run in its stores' partitions: its foreign-key joins' right
    inputs are source stores (each partition reads them whole: ``whole_inputs``); its group-by
    aggregates cross a repartition (``stages``): the tables after an aggregate (up to the next
    group-by, which crosses a repartition of its own) read, besides it and each other, only
    source inputs that nothing else reads, and include no foreign-key join."""
    derived = {t.name for t in tables}
    for spec in tables:
        if spec.op == "fk_join" and spec.inputs[1] in derived:
            return False
        if _regroups(spec):
            after = [t for t in _after(tables, spec.name) if not _regroups(t)]
            inside = {spec.name} | {t.name for t in after}
            if any(t.op == "fk_join" or any(i in derived and i not in inside for i in t.inputs) for t in after):
                return False
            own = set(own_inputs(tables, spec.name))
            if any(i in own for t in tables if t.name not in inside - {spec.name} for i in t.inputs):
                return False
    return True


def stages(work: PassWork) -> list[PassWork]:
    """The pass cut at its repartitions (module docstring): the first stage, then one per
    group-by aggregate, in file order, which also reads the records of its own inputs
    (``own_inputs``) and routes the changes of a group-by after it to that one's stage. A pass
    with one partition is one stage: its aggregates apply their changes in place."""
    tables = list(work.tables)
    aggregates = [t.name for t in tables if _regroups(t)]
    if work.partitions == 1 or not aggregates:
        return [work]
    after = {a: _after(tables, a) for a in aggregates}
    later = {a: {a} | {t.name for t in after[a] if not _regroups(t)} for a in aggregates}
    nested = {a: tuple(t.name for t in after[a] if _regroups(t)) for a in aggregates}
    own = {a: set(own_inputs(tables, a)) for a in aggregates}
    moved = set().union(*later.values())  # tables computed after a repartition
    owned = set().union(*own.values())  # inputs read after a repartition
    top = tuple(a for a in aggregates if not any(a in n for n in nested.values()))

    def stage(names: set[str], computed: set[str], inputs: set[str], regrouped: str,
              repartitioned: tuple[str, ...]) -> PassWork:
        """The tables ``names`` of the pass, of which ``computed`` are read and written here,
        over the records of ``inputs``; ``repartitioned``: the aggregates it routes changes to."""
        return replace(work, tables=tuple(t for t in work.tables if t.name in names),
                       writers=tuple(w for w in work.writers if w in computed),
                       reads=tuple(r for r in work.reads if r.name in computed),
                       runs=tuple(r for r in work.runs if r[0] in computed),
                       inputs=tuple(i for i in work.inputs if i[0] in inputs),
                       repartitioned=repartitioned, regrouped=regrouped)

    every = {t.name for t in work.tables} | {r.name for r in work.reads}
    first = stage(every - (moved - set(top)), every - moved - owned, {name for name, _ in work.inputs} - owned,
                  "", top)
    return [first] + [stage(later[a] | set(nested[a]), later[a] | own[a], own[a], a, nested[a]) for a in aggregates]


class Readers:
    """The snapshot readers of one process, kept across the partitions it runs (one file listing
    per table per task, not per partition)."""

    def __init__(self, work: PassWork) -> None:
        self._reads = {r.name: r for r in work.reads}
        self._open: dict[str, SnapshotReader] = {}

    def get(self, name: str) -> SnapshotReader:
        if name not in self._open:
            self._open[name] = self._reads[name].reader()
        return self._open[name]

    def close(self) -> None:
        for reader in self._open.values():
            reader.close()
        self._open.clear()


def merge_inputs(work: PassWork) -> list[tuple[str, bool]]:
    """The inputs a partition of ``work`` merges, by rank: its source inputs in declaration order,
    each store it reads whole (``whole_inputs``) right after that store's own records. In a
    stage after a repartition its group updates come after these, one input per input
    partition, in partition order (``PartitionRun``)."""
    whole = whole_inputs(work)
    out = []
    for name, is_stream in work.inputs:
        out.append((name, is_stream))
        if name in whole:
            out.append((whole_name(name), False))
    return out


class PartitionRun:
    """Partition ``partition`` of a pass (or of a stage after a repartition), fed its records
    in merge order, a chunk at a time, as a Kafka Streams task is fed from its topics.

    The merge order (docs/semantics.md, rule 23: the head record with the smallest timestamp
    next, ties to the input of lower rank, ``merge_inputs``) is given, not computed here: the
    engines sort each partition's records by (the running maximum of their input's timestamps
    up to each record, rank, the input's own order), which is the same sequence (the head of an
    input is only ever taken when it is no later than every other head, so a record behind its
    input's maximum follows that maximum at once). A task therefore never holds its records:
    ``feed`` bulk-loads the state a chunk touches (``_prefetch``) and applies it, ``drain``
    hands out what the chunk emitted, and ``finish`` adds the rows of the changed stores (a
    later record can still change them) and the statistics. Memory is the partition's state
    and one chunk."""

    def __init__(self, work: PassWork, partition: int, readers: Readers) -> None:
        self.work = work
        self.partition = partition
        self.states = _states(work, partition, readers)
        whole = whole_inputs(work)
        for name in whole:
            read = next(r for r in work.reads if r.name == name)
            self.states[whole_name(name)] = TableState(whole_name(name), read.kind, read.history_retention_ms,
                                                       read.partitions, readers.get(name), latest_only=True)
        self.topology = Topology(list(work.tables), self.states, partition, work.repartitioned, whole)
        self.inputs = merge_inputs(work)
        aggregate = self.topology.nodes[work.regrouped].operator if work.regrouped else None
        assert aggregate is None or isinstance(aggregate, Aggregate)
        self._aggregate = aggregate
        self._shipped = dict.fromkeys(self.topology.updates, 0)  # group updates handed out, by aggregate
        self._update_max: dict[str, dict[int, int]] = {}  # their largest timestamp so far, by aggregate
        self._groups = Partitioning(work.partitions, work.partitioner)
        self._rows = dict.fromkeys(work.writers, 0)  # rows handed out (stream records, store rows), by writer
        self._late = dict.fromkeys(work.writers, 0)

    def feed(self, rows: list[tuple[Any, ...]]) -> None:
        """Apply the next records in merge order: (rank, key, value, timestamp, partition) each;
        a group update (rank past ``merge_inputs``) also (old, input key), ``key`` its group,
        ``value`` its new value and ``partition`` the input partition that made it."""
        n = len(self.inputs)
        records: dict[str, list[SourceRecord]] = {}
        groups: set[str] = set()
        for row in rows:
            rank = row[0]
            if rank < n:
                records.setdefault(self.inputs[rank][0], []).append(SourceRecord(row[1], row[2], row[3], row[4]))
            else:
                groups.add(row[1])
        if self.work.regrouped:
            _prefetch(list(self.work.tables[1:]), self.states, records, self.topology, {self.work.regrouped: groups})
        else:
            _prefetch(list(self.work.tables), self.states, records, self.topology)
        record, update, inputs, regrouped = self.topology.record, self.topology.update, self.inputs, self.work.regrouped
        aggregate = self._aggregate
        for row in rows:
            rank = row[0]
            if rank < n:
                name, is_stream = inputs[rank]
                record(name, is_stream, row[1], row[2], row[3], row[4])
            else:
                assert aggregate is not None
                update(regrouped, aggregate.regrouped(row[1], row[6], row[5], row[2], row[3]))

    def drain(self) -> PartitionResult:
        """What the records fed so far emitted and nothing handed out yet: ``_emitted`` rows, late
        results, a stream output's records, group updates for the next stage."""
        result = PartitionResult(self.partition)
        for name, updates in self.topology.updates.items():
            operator = self.topology.nodes[name].operator
            assert isinstance(operator, Aggregate)
            shipped = []
            tops = self._update_max.setdefault(name, {})  # by the group partition they go to
            destinations = self._groups.of_keys(pa.array([u.group for u in updates], pa.string())).tolist()
            for u, to in zip(updates, destinations, strict=True):
                top = tops.get(to)
                tops[to] = top = u.timestamp if top is None or u.timestamp > top else top
                shipped.append((u.group, u.key, *operator.shipped(u), u.timestamp, top))
            result.updates[name] = shipped
            result.shipped_before[name] = self._shipped[name]
            self._shipped[name] += len(updates)
            updates.clear()
        for name in self.work.writers:
            node = self.topology.nodes[name]
            run = self.work.run_of(name)
            rows = _stream_rows(run, node) if node.own is None else None
            late = late_table(run, node, self.partition)
            result.tables[name] = TableOutcome(rows, emission_table(run, node.emissions), late)
            self._rows[name] += 0 if rows is None else rows.num_rows
            self._late[name] += late.num_rows
            node.emissions.clear()
            node.late.clear()
        return result

    def finish(self) -> Iterator[PartitionResult]:
        """``drain``, then each writer's changed store rows (a later record could still have
        changed them; ``STORE_KEYS_PER_PART`` keys' rows at a time), a foreign-key join's moved
        pointers and the statistics of the partition (counts, stream time, how many rows of each
        kind it handed out)."""
        yield self.drain()
        for name in self.work.writers:
            node = self.topology.nodes[name]
            run = self.work.run_of(name)
            own = node.own
            if own is not None:
                for rows in own.changed_rows(run, node.spec.buckets, STORE_KEYS_PER_PART):
                    self._rows[name] += rows.num_rows
                    yield PartitionResult(self.partition, {name: TableOutcome(rows=rows)})
            subscriptions = node.operator.subscriptions.rows(run) if isinstance(node.operator, ForeignKeyJoin) else None
            stream_time = None if own is None else own.stream_time.get(self.partition)
            stats = {
                "counts": vars(node.counts), "stream_time": stream_time,
                "rows": self._rows[name], "late": self._late[name],
                "subscriptions": 0 if subscriptions is None else subscriptions.num_rows,
            }
            yield PartitionResult(self.partition, {name: TableOutcome(subscriptions=subscriptions, stats=stats)})


#: How many keys' store rows a partition builds at once when it finishes (``PartitionRun.finish``).
STORE_KEYS_PER_PART = 65_536


def _states(work: PassWork, partition: int, readers: Readers) -> dict[str, TableState]:
    """The states of the tables ``partition`` reads and writes; a store of several partitions in a
    pass of several holds that partition's keys only (``TableState.home``)."""
    latest = latest_only(work)
    return {read.name: TableState(read.name, read.kind, read.history_retention_ms, read.partitions,
                                  readers.get(read.name), read.name in latest,
                                  partition if work.partitions > 1 and read.partitions > 1 else None)
            for read in work.reads}


def latest_only(work: PassWork) -> set[str]:
    """The tables whose state needs each key's newest version only (``TableState.latest_only``):
    the pass's source stores (read, never written) and its aggregates, unless a stream-table
    join reads them as its table, as of its records' times."""
    as_of = {t.inputs[1] for t in work.tables if t.op == "stream_join"}
    sources = {name for name, is_stream in work.inputs if not is_stream}
    return (sources | {t.name for t in work.tables if t.op == "aggregate"}) - as_of


def _prefetch(tables: list[TableSpec], states: dict[str, TableState],
              records: dict[str, list[SourceRecord]], topology: Topology,
              changed: dict[str, set[str]] | None = None) -> None:
    """Bulk-load the keys the partition will touch where they are known up front (the rest load
    one key at a time on demand). ``changed``: keys known to change in tables outside ``tables``."""
    candidates: dict[str, set[str]] = {name: {r.key for r in recs} for name, recs in records.items()}
    candidates.update(changed or {})
    for name, state in states.items():
        if name in candidates:
            state.prefetch(candidates[name])
    for spec in tables:
        keys: set[str] = set()
        if spec.op in ("filter", "copy", "to_table", "join", "stream_join"):
            keys = set().union(*(candidates.get(i, set()) for i in spec.inputs))
            for i in spec.inputs:
                if i in states:
                    states[i].prefetch(keys)
        elif spec.op == "fk_join":
            operator = topology.nodes[spec.name].operator
            assert isinstance(operator, ForeignKeyJoin)
            left, right = topology.nodes[spec.name].inputs  # the right store read whole, if it is
            left_records = [(r.key, r.value) for r in records.get(left, [])]
            keys = operator.prefetch(candidates.get(left, set()), candidates.get(right, set()), left_records)
        elif spec.op == "aggregate" and spec.group_by is not None and _groups_wanted(spec, tables, states):
            source = spec.inputs[0]
            pairs = [(r.key, r.value) for r in records.get(source, [])]
            if source in states:
                pairs += [(k, v[1]) for k in candidates.get(source, set()) if (v := states[source].latest(k))]
            for key, value in pairs:
                if value is not None:
                    group = key_string(spec.group_by.evaluate(key, parse_value(value)))
                    if group is not None:
                        keys.add(group)
        candidates[spec.name] = keys
        if spec.name in states:
            states[spec.name].prefetch(keys)


def _groups_wanted(spec: TableSpec, tables: list[TableSpec], states: dict[str, TableState]) -> bool:
    """Whether prefetching needs the groups an aggregate's records touch: to load them from its
    own table's snapshot, or for a table that reads the aggregate."""
    own = states.get(spec.name)
    return (own is not None and not own.fully_loaded) or any(spec.name in t.inputs for t in tables)


def _stream_rows(run: int, node: DerivedNode) -> pa.Table:
    """A stream output's records (``STREAM_SCHEMA``), ``seq`` its local emission sequence."""
    emitted = node.emissions
    return pa.table({
        "bucket": [bucket_of(e.key, node.spec.buckets) for e in emitted],
        "key": [e.key for e in emitted], "value": [e.value for e in emitted],
        "timestamp": [e.timestamp for e in emitted], "run": [run] * len(emitted),
        "seq": [e.sequence for e in emitted],
    }, schema=STREAM_SCHEMA)


def emission_table(run: int, emissions: Iterable[Emission]) -> pa.Table:
    items = list(emissions)
    return pa.table({
        "run": [run] * len(items),
        "sequence": [e.sequence for e in items],
        "key": [e.key for e in items],
        "value": [e.value for e in items],
        "timestamp": [e.timestamp for e in items],
        "cause": [e.cause for e in items],
    }, schema=EMITTED_SCHEMA)


def late_table(run: int, node: DerivedNode, partition: int) -> pa.Table:
    """A derived table's results later than its grace, as ``_rejected`` rows: ``source`` is
    the input that caused the result, ``row`` its emission sequence, ``raw`` the result."""
    stream_time = node.own.stream_time.get(partition) if node.own is not None else None
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    rows = [{
        "run": run, "source": e.cause, "line": None, "row": e.sequence, "partition": None, "offset": None,
        "reason": "late",
        "raw": f'{{"key":{json.dumps(e.key, ensure_ascii=False)},"timestamp":{e.timestamp},'
               f'"value":{"null" if e.value is None else e.value}}}',
        "detail": f"result timestamp {e.timestamp} is before the table's stream time {stream_time} minus its "
                  f"history retention {node.spec.history_retention_ms} ms",
        "ingested_at": now,
    } for e in node.late]
    return pa.Table.from_pylist(rows, schema=REJECTED_SCHEMA)
