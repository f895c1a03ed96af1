"""The derive phase of a pipeline run (``ingest.run``): compute every derived table from the changelogs of its sources.

Derived batches ("passes") are what make derived tables incremental and crash-safe:

- Every derived commit records, per upstream source, the source run and snapshot it was
  computed up to (``StoreState.sources``) and the snapshot of each direct input
  (``StoreState.inputs``, served as ``inputs`` by the HTTP API).
- A table is a *writer* of this run when some source has runs it has not consumed. Writers that
  consumed the same source runs share one pass: the source tables are loaded as they were at
  those runs (Delta time travel), the records of the newer runs are read from the sources'
  ``_changelog`` (stores) or stream tables in their own order, and the topology processes them.
  Upstream derived tables a writer reads but that are not writers of the pass (already up to
  date, e.g. committed just before a crash) are recomputed in memory from their snapshot at the
  pass's starting point and not written again.
- Each writer then appends its changed rows, its ``_emitted`` results, its late results
  (``_rejected``) and, for a foreign-key join, its ``_subscriptions`` in atomic commits: the
  side tables' at once (``versiq.ingest.delta.replace_runs``; none for a side table the run
  has nothing for), the table's last, at most once per run (``versiq.ingest.delta.run_txn_needed``).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from deltalake.exceptions import DeltaError
from pyspark.sql import DataFrame, SparkSession

from versiq import layout, storage
from versiq.ingest.config import Pipeline
from versiq.ingest.derived.job import InputRead, JobOutput, pass_records, run_here, run_job
from versiq.ingest.derived.spec import TableSpec
from versiq.ingest.derived.tasks import PassWork, TableRead, repartitionable, stages, whole_inputs
from versiq.ingest.errors import LeaseLost
from versiq.ingest.plan import derives_here
from versiq.ingest.reports import TableReport
from versiq.ingest.side_by_side import large_run_turn, run_side_by_side
from versiq.ingest.store import (
    RUN,
    LockTimeout,
    StoreHandle,
    commit_sides,
    commit_store,
    open_store,
    writer_lock,
)
from versiq.layout import (
    EMITTED_DIR,
    REJECTED_DIR,
    STREAM_KIND,
    SUBSCRIPTIONS_DIR,
    StoreSettings,
    StoreState,
    has_table,
    read_state,
)
from versiq.logs import counted

log = logging.getLogger("versiq.ingest")


class DeriveError(Exception):
    """A derived table cannot be computed from what its inputs kept (message says what to do)."""


#: Failures the derive phase reports in one line (the report's ``error`` and one log line, no
#: traceback): what the inputs kept, another writer's lock or a lost lease, the file system and
#: Delta itself.
#: Anything else is a defect and is logged with its traceback.
EXPLAINED_FAILURES = (DeriveError, LockTimeout, LeaseLost, OSError, DeltaError)


@dataclass(frozen=True)
class SourceInfo:
    """A source store or stream as the derive phase found it (after this run's ingest)."""

    name: str
    path: str
    settings: StoreSettings
    run: int
    snapshot: int | None
    changelog_since: int | None

    @property
    def is_stream(self) -> bool:
        return self.settings.kind == STREAM_KIND


# -- the derive phase -------------------------------------------------------------------------

def _table_settings(spec: TableSpec) -> StoreSettings:
    return StoreSettings(kind=spec.kind, history_retention_ms=spec.history_retention_ms, partitions=1,
                         buckets=spec.buckets)


def _source_info(warehouse: str, name: str) -> SourceInfo:
    path = layout.table_path(warehouse, name)
    if not has_table(path):
        raise DeriveError(f"input {name!r} has no table in the warehouse (its ingest failed?)")
    table = storage.delta_table(path)
    settings = StoreSettings.from_description(table.metadata().description)
    version = table.version()
    state = read_state(path, version)
    return SourceInfo(name, path, settings, state.run, version, state.changelog_since)


def _upstream(tables: dict[str, TableSpec], name: str) -> set[str]:
    """Every derived table ``name`` reads, directly or not."""
    out: set[str] = set()
    for parent in tables[name].inputs:
        if parent in tables:
            out |= {parent} | _upstream(tables, parent)
    return out


def _sources_of(tables: dict[str, TableSpec], name: str) -> set[str]:
    out: set[str] = set()
    for parent in tables[name].inputs:
        out |= _sources_of(tables, parent) if parent in tables else {parent}
    return out


def derive(spark: SparkSession, warehouse: str, pipeline: Pipeline, lock_timeout_s: float) -> dict[str, TableReport]:
    warehouse = storage.normalize(warehouse)
    specs = {t.name: t for t in pipeline.tables}
    order = [t.name for t in pipeline.tables]
    reports: dict[str, TableReport] = {}
    sources_of = {name: _sources_of(specs, name) for name in order}
    with contextlib.ExitStack() as stack:
        try:
            infos = {name: _source_info(warehouse, name) for name in set().union(*sources_of.values())}
            handles = _open_tables(stack, warehouse, specs, order, lock_timeout_s)
        except EXPLAINED_FAILURES as exc:  # no table can run: each is reported with the reason
            log.error("derived tables %s failed: %s", ", ".join(order), exc)
            return {name: TableReport(kind=specs[name].kind, error=f"{type(exc).__name__}: {exc}")
                    for name in order}
        consumed = {name: tuple(sorted((s, handles[name].state.sources.get(s, {"run": 0})["run"])
                                       for s in sources_of[name])) for name in order}
        target = {s: info.run for s, info in infos.items()}
        passes: dict[tuple[tuple[str, int], ...], list[str]] = {}
        for name in order:
            if handles[name].table is None or any(run != target[s] for s, run in consumed[name]):
                passes.setdefault(consumed[name], []).append(name)
            else:
                reports[name] = TableReport(kind=specs[name].kind, snapshot=handles[name].version,
                                            inputs=dict(handles[name].state.inputs))

        def run_topologies(session: SparkSession, group: list[Topology]) -> None:
            for topology in group:
                started = time.monotonic()
                writers = topology.writers
                try:
                    _run_topology(session, pipeline, topology.tables, writers, handles,
                                  [infos[s] for s in topology.sources], sources_of, topology.start, reports)
                except Exception as exc:  # noqa: BLE001 - reported per table; other topologies go on
                    if isinstance(exc, EXPLAINED_FAILURES):  # explained in one line: no traceback
                        log.error("derived tables %s failed: %s", ", ".join(writers), exc)
                    else:
                        log.exception("derived tables %s failed", ", ".join(writers))
                    for name in writers:  # the tables committed before the failure keep their report
                        if name not in reports:
                            reports[name] = TableReport(kind=specs[name].kind, error=f"{type(exc).__name__}: {exc}")
                for name in writers:
                    reports[name].seconds = time.monotonic() - started

        topologies = [topology for start, writers in passes.items()
                      for topology in _topologies(specs, order, sources_of, dict(start), writers)]
        for outcome in run_side_by_side(spark, _apart(topologies), run_topologies,
                                        what=("group of derived tables", "groups of derived tables")):
            if isinstance(outcome, BaseException):
                raise outcome
    return {name: reports[name] for name in order}


@dataclass(frozen=True)
class Topology:
    """One topology of a pass (``_components``): its tables (the writers and the derived tables
    they read), the ones it writes, its sources and the source runs its writers consumed."""

    tables: list[TableSpec]
    writers: list[str]
    sources: list[str]
    start: dict[str, int]


def _topologies(specs: dict[str, TableSpec], order: list[str], sources_of: dict[str, set[str]],
                start: dict[str, int], writers: list[str]) -> list[Topology]:
    """The topologies of the pass of ``writers`` (the tables that consumed the source runs
    ``start``), in the pipeline file's order."""
    members = set(writers)
    for name in writers:
        members |= _upstream(specs, name)
    out = []
    for component in _components([specs[name] for name in order if name in members]):
        names = {t.name for t in component}
        sources = sorted(set().union(*(sources_of[t.name] for t in component)))
        out.append(Topology(component, [w for w in writers if w in names], sources, start))
    return out


def _apart(topologies: list[Topology]) -> list[list[Topology]]:
    """``topologies`` in groups that share no derived table (a pass's topologies never do;
    those of two passes may, one writing a table the other reads), each group in the order
    given: the groups run side by side (``side_by_side``), a group's topologies one after the
    other. A topology holds every derived table its tables read, so two of them share a table
    exactly when their tables are connected (``_components``, over all of them)."""
    tables = {t.name: t for topology in topologies for t in topology.tables}
    group_of = {t.name: n for n, component in enumerate(_components(list(tables.values()))) for t in component}
    groups: dict[int, list[Topology]] = {}
    for topology in topologies:
        groups.setdefault(group_of[topology.tables[0].name], []).append(topology)
    return list(groups.values())


def _open_tables(stack: contextlib.ExitStack, warehouse: str, specs: dict[str, TableSpec], order: list[str],
                 lock_timeout_s: float) -> dict[str, StoreHandle]:
    """Lock and open every derived table of the pipeline (held until ``stack`` closes)."""
    handles: dict[str, StoreHandle] = {}
    for name in order:
        path = layout.table_path(warehouse, name)
        stack.enter_context(writer_lock(path, lock_timeout_s, RUN))
        handle = open_store(path, _table_settings(specs[name]), {"kind", "history_retention", "buckets"})
        handles[name] = handle
    return handles


def _newest_snapshot(path: str, current: int | None, wanted: Callable[[StoreState], bool],
                     stop: Callable[[StoreState], bool]) -> int | None:
    """The newest snapshot <= ``current`` whose state is ``wanted``, scanning back until a state
    is ``stop`` or the log ends (cleaned up log files end it too); None when not found."""
    version = -1 if current is None else current
    while version >= 0:
        try:
            state = read_state(path, version)
        except FileNotFoundError:
            return None
        if wanted(state):
            return version
        if stop(state):
            return None
        version -= 1
    return None


def _snapshot_of_run(path: str, current: int | None, run: int) -> int:
    """The newest snapshot of a source store whose state is run ``run``: the store exactly as
    that run left it. Compaction and vacuum commits carry the state unchanged, so this is the
    newest compacted (hence still readable) copy, not the possibly vacuumed original."""
    found = _newest_snapshot(path, current, lambda state: state.run == run, lambda state: state.run < run)
    if found is None:
        raise DeriveError(f"store {storage.basename(path)!r}: no readable snapshot of run {run} (its Delta log "
                          "was cleaned up); delete the derived tables of this pipeline to rebuild them")
    return found


def _find_snapshot(path: str, current: int | None, start: dict[str, int]) -> int | None:
    """The newest snapshot of a derived table computed from exactly the source runs ``start``;
    None means "before its first commit" (every start run is 0)."""
    def computed_from_start(state: StoreState) -> bool:
        return all(state.sources.get(s, {"run": 0})["run"] == run for s, run in start.items())

    found = _newest_snapshot(path, current, computed_from_start, lambda state: False)
    if found is not None or all(run == 0 for run in start.values()):
        return found
    raise DeriveError(f"derived table {storage.basename(path)!r} has no snapshot computed from source runs "
                      f"{start}; delete the derived tables of this pipeline to rebuild them")


def _bootstrap_read(info: SourceInfo, run: int, upto: int) -> InputRead:
    """What a table added over store ``info`` starts from: the history the store holds after
    run ``run`` as a changelog (every version a query could still return: validTo after its
    partition's horizon, or still valid; tombstones included, as they end the validity before
    them; a timestamped store's current values, in (timestamp, key) order, so every record is
    in order for its key), then its changelog of runs (run, ``upto``]."""
    try:
        snapshot = _snapshot_of_run(info.path, info.snapshot, run)
    except DeriveError:
        raise DeriveError(f"store {info.name!r}: no readable snapshot of run {run} (its Delta log was cleaned up), "
                          "the history a table added over it starts from; delete the store and ingest it again "
                          "from its files") from None
    log.info("store %s: derived tables start from its snapshot %d (run %d)", info.name, snapshot, run)
    return InputRead(info.name, info.path, False, run, upto, kind=info.settings.kind, bootstrap=snapshot,
                     stream_time=dict(read_state(info.path, snapshot).stream_time),
                     history_retention_ms=info.settings.history_retention_ms)


def _input_read(info: SourceInfo, after: int) -> InputRead:
    """What the pass reads of source ``info`` that last consumed its run ``after``."""
    covered = info.changelog_since is not None and info.changelog_since <= after + 1
    if info.run > after and not info.is_stream and not covered:
        if after:  # a table that consumed runs of this store always had their changelog
            first = (info.changelog_since or info.run + 1) - 1
            raise DeriveError(f"store {info.name!r} has no changelog of runs {after + 1}..{first}; delete the "
                              "derived tables of this pipeline to rebuild them from the store")
        if info.changelog_since is None:  # its ingest failed before committing to keep one
            raise DeriveError(f"store {info.name!r} keeps no changelog yet (its ingest did not complete in this "
                              "run); run the pipeline again")
        # A store ingested before any table read it: bootstrap from what it holds
        # (docs/derived-tables.md, "Tables added over an existing store"), then go on
        # with its changelog from the first run that kept one.
        return _bootstrap_read(info, info.changelog_since - 1, info.run)
    return InputRead(info.name, info.path, info.is_stream, after, info.run, kind=info.settings.kind)


def _components(tables: list[TableSpec]) -> list[list[TableSpec]]:
    """The pass's tables cut into topologies: tables connected through derived tables (one
    reads the other, or both read a third, directly or not). Each topology reads its source
    records itself and has its own partitions; tables that share only source inputs are
    independent, since the merge of rule 23 restricted to a table's inputs is the merge of those
    inputs alone."""
    derived = {t.name for t in tables}
    parent: dict[str, str] = {}

    def find(name: str) -> str:
        while parent.setdefault(name, name) != name:
            name = parent[name]
        return name

    for spec in tables:
        for name in spec.inputs:
            if name in derived:
                parent[find(name)] = find(spec.name)
    groups: dict[str, list[TableSpec]] = {}
    for spec in tables:
        groups.setdefault(find(spec.name), []).append(spec)
    return list(groups.values())


def pass_partitions(tables: list[TableSpec], sources: list[SourceInfo]) -> tuple[int, str]:
    """How many partitions a new topology gets, and the partitioner its stream records (and an
    aggregate's groups) are placed by (docs/semantics.md, rule 23): the partition count of its
    source stores when they all have the same one and the same partitioner, and its re-keying
    tables can cross a repartition (``tasks.repartitionable``); else 1. A store read only as a
    foreign-key join's right input is read whole by every partition: its own count does not
    matter."""
    read_whole = {t.inputs[1] for t in tables if t.op == "fk_join"} - {
        name for t in tables for side, name in enumerate(t.inputs) if t.op != "fk_join" or side == 0}
    stores = [s.settings for s in sources if not s.is_stream and s.name not in read_whole]
    if not stores or not repartitionable(tables):
        return 1, layout.DEFAULT_PARTITIONER
    counts = {(s.partitions, s.partitioner) for s in stores}
    if len(counts) != 1:
        return 1, layout.DEFAULT_PARTITIONER
    partitions, partitioner = counts.pop()
    return partitions, partitioner


def _run_topology(spark: SparkSession, pipeline: Pipeline, tables: list[TableSpec], writers: list[str],
                  handles: dict[str, StoreHandle], sources: list[SourceInfo], sources_of: dict[str, set[str]],
                  start: dict[str, int], reports: dict[str, TableReport]) -> None:
    partitions, partitioner = pass_partitions(tables, sources)
    built = {handles[t.name].settings.partitions for t in tables
             if not t.is_stream and handles[t.name].table is not None}
    if built:  # a table keeps the partitions it was built with: its keys' stream times are there
        if len(built) > 1 or (partitions not in built and built != {1}):
            raise DeriveError(f"derived tables {', '.join(t.name for t in tables)} were built with {sorted(built)} "
                              f"partition(s) and their inputs now have {partitions}; rebuild them (versiq rebuild)")
        partitions = built.pop()
    reads: list[TableRead] = []
    inputs_read: list[InputRead] = []
    for info in sources:
        after = start.get(info.name, 0)
        inputs_read.append(_input_read(info, after))
        if info.is_stream:
            continue
        snapshot = _snapshot_of_run(info.path, info.snapshot, after) if after else None
        settings = info.settings
        reads.append(TableRead(info.name, info.path, snapshot, settings.kind, settings.history_retention_ms,
                               settings.buckets, settings.partitions))
    for spec in tables:
        if spec.is_stream:
            continue
        handle = handles[spec.name]
        if spec.name in writers:
            version = handle.version
        else:
            version = _find_snapshot(handle.path, handle.version,
                                     {s: start.get(s, 0) for s in sources_of[spec.name]})
        reads.append(TableRead(spec.name, handle.path, version, spec.kind, spec.history_retention_ms, spec.buckets))
    names = {s.name for s in sources}
    work = PassWork(
        tables=tuple(tables), writers=tuple(writers), reads=tuple(reads),
        inputs=tuple((name, next(s for s in sources if s.name == name).is_stream)
                     for name in pipeline.inputs if name in names),
        runs=tuple((name, handles[name].state.run + 1) for name in writers), partitions=partitions,
        partitioner=partitioner)
    at_most = pass_records(inputs_read)
    here = derives_here(at_most)
    regrouped = [stage.regrouped for stage in stages(work)[1:]]
    whole = whole_inputs(work)
    log.info("derived pass over %s: at most %d source record(s), %d partition(s)%s%s, %s", ", ".join(writers),
             at_most, partitions, f", {', '.join(regrouped)} through a repartition" if regrouped else "",
             f", {', '.join(whole)} read whole by each" if whole else "",
             "in this process" if here else "in Spark tasks")
    with large_run_turn(here):  # a pass in Spark tasks waits for the large runs beside it
        output = (run_here if here else run_job)(spark, work, inputs_read, partitioner)
        try:
            infos = {s.name: s for s in sources}
            for spec in tables:
                if spec.name in writers:
                    reports[spec.name] = _commit(spec, handles, infos, output, sources_of[spec.name], partitions)
        finally:
            output.release()


def _or_minus_one(version: int | None) -> int:
    return -1 if version is None else version


def _commit(spec: TableSpec, handles: dict[str, StoreHandle], infos: dict[str, SourceInfo], output: JobOutput,
            sources: set[str], partitions: int) -> TableReport:
    handle = handles[spec.name]
    totals = output.totals[spec.name]
    run = handle.state.run + 1
    inputs: dict[str, int] = {}
    for name in spec.inputs:
        snapshot = infos[name].snapshot if name in infos else handles[name].version
        if snapshot is not None:
            inputs[name] = snapshot
    state = StoreState(
        run=run,
        stream_time={**handle.state.stream_time, **totals.stream_time} if not spec.is_stream else {},
        sources={s: {"run": infos[s].run, "snapshot": _or_minus_one(infos[s].snapshot)} for s in sorted(sources)},
        inputs=inputs,
        definition=spec.definition,
    )
    if handle.table is None and not spec.is_stream:  # a new table is built with the pass's partitions
        handle.settings = replace(handle.settings, partitions=partitions)
    # side tables first (at once), the table's commit (data + state) last: docs in versiq.ingest.delta
    emitted = totals.counts.emitted
    sides = {EMITTED_DIR: (_small(output.output("emitted", spec.name), emitted), emitted == 0),
             REJECTED_DIR: (_small(output.output("late", spec.name), totals.late), totals.late == 0)}
    if spec.op == "fk_join":  # created on the first run even when empty: its absence means "build it"
        subscriptions = storage.join(handle.path, SUBSCRIPTIONS_DIR)
        sides[SUBSCRIPTIONS_DIR] = (_small(output.output("subscriptions", spec.name), totals.subscriptions),
                                    totals.subscriptions == 0 and has_table(subscriptions))
    commit_sides(handle.path, state, sides)
    rows = output.output("stream" if spec.is_stream else "store", spec.name)
    version = commit_store(handle, rows.coalesce(1) if totals.rows <= SMALL_ROWS else rows.repartition("bucket"), state)
    c = totals.counts
    report = TableReport(kind=spec.kind, emitted=c.emitted, accepted_latest=c.accepted_latest,
                         accepted_out_of_order=c.accepted_out_of_order,
                         replaced_same_timestamp=c.replaced_same_timestamp, tombstones=c.tombstones,
                         snapshot=version, run=run, inputs=dict(state.inputs))
    report.rejected["late"] = c.late
    log.info("table %s: run %d emitted %s -> snapshot %d", spec.name, run, counted(c.emitted, "result"), version)
    return report


#: Rows a table's output of one run may have to be written by one task (one file per bucket);
#: more are spread over tasks by bucket.
SMALL_ROWS = 100_000


def _small(frame: DataFrame, rows: int) -> DataFrame:
    return frame.coalesce(1) if rows <= SMALL_ROWS else frame
