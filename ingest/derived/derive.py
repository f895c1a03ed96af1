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
- Each writer then appends its changed rows, its ``_emitted`` results and its late results
  (``_rejected``) in atomic commits, the table's last, at most once per run
  (``versiq.ingest.delta.run_txn_needed``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
from deltalake.exceptions import DeltaError
from pyspark.sql import SparkSession

from versiq import layout, storage
from versiq.ingest.config import Pipeline
from versiq.ingest.derived.expressions import key_string, parse_value
from versiq.ingest.derived.operators import ForeignKeyJoin
from versiq.ingest.derived.spec import TableSpec
from versiq.ingest.derived.state import SnapshotReader, TableState
from versiq.ingest.derived.topology import DerivedNode, Emission, SourceRecord, Topology
from versiq.ingest.errors import LeaseLost
from versiq.ingest.frames import local_frame
from versiq.ingest.reports import TableReport
from versiq.ingest.store import (
    LockTimeout,
    StoreHandle,
    commit_side,
    commit_store,
    open_store,
    writer_lock,
)
from versiq.layout import (
    CHANGELOG_DIR,
    EMITTED_DIR,
    EMITTED_SCHEMA,
    REJECTED_DIR,
    REJECTED_SCHEMA,
    STREAM_KIND,
    STREAM_SCHEMA,
    StoreSettings,
    StoreState,
    bucket_of,
    has_table,
    read_rule_sql,
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
        for start, writers in passes.items():
            started = time.monotonic()
            try:
                _run_pass(spark, pipeline, specs, handles, infos, sources_of, dict(start), writers, reports)
            except Exception as exc:  # noqa: BLE001 - reported per table; other passes go on
                if isinstance(exc, EXPLAINED_FAILURES):  # explained in one line: no traceback
                    log.error("derived tables %s failed: %s", ", ".join(writers), exc)
                else:
                    log.exception("derived tables %s failed", ", ".join(writers))
                for name in writers:  # the tables committed before the failure keep their report
                    if name not in reports:
                        reports[name] = TableReport(kind=specs[name].kind, error=f"{type(exc).__name__}: {exc}")
            for name in writers:
                reports[name].seconds = time.monotonic() - started
    return {name: reports[name] for name in order}


def _open_tables(stack: contextlib.ExitStack, warehouse: str, specs: dict[str, TableSpec], order: list[str],
                 lock_timeout_s: float) -> dict[str, StoreHandle]:
    """Lock and open every derived table of the pipeline (held until ``stack`` closes)."""
    handles: dict[str, StoreHandle] = {}
    for name in order:
        path = layout.table_path(warehouse, name)
        stack.enter_context(writer_lock(path, lock_timeout_s))
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


def _read_records(path: str, after: int, upto: int, is_stream: bool) -> list[SourceRecord]:
    """Records of runs (after, upto] of a stream table or a store's ``_changelog``, in order."""
    table_path = path if is_stream else storage.join(path, CHANGELOG_DIR)
    if upto <= after or not has_table(table_path):
        return []
    files = list(storage.delta_table(table_path).file_uris())
    if not files:
        return []
    part = "0" if is_stream else '"partition"'
    con = storage.duckdb_connect(path)
    try:
        rows = con.sql(
            f"SELECT key, value, timestamp, {part} FROM read_parquet($files) WHERE run > $after AND run <= $upto "
            "ORDER BY run, seq", params={"files": files, "after": after, "upto": upto}).fetchall()
    finally:
        con.close()
    return [SourceRecord(k, v, int(t), int(p)) for k, v, t, p in rows]


def _bootstrap_records(info: SourceInfo, run: int) -> list[SourceRecord]:
    """The history store ``info`` holds after run ``run``, as a changelog: every version a query
    could still return (validTo after its partition's horizon, or still valid; tombstones
    included, as they end the validity before them; a timestamped store's current values), in
    (timestamp, key) order, so every record is in order for its key."""
    try:
        snapshot = _snapshot_of_run(info.path, info.snapshot, run)
    except DeriveError:
        raise DeriveError(f"store {info.name!r}: no readable snapshot of run {run} (its Delta log was cleaned up), "
                          "the history a table added over it starts from; delete the store and ingest it again "
                          "from its files") from None
    files = list(storage.delta_table(info.path, version=snapshot).file_uris())
    if not files:
        return []
    settings = info.settings
    state = read_state(info.path, snapshot)
    observable = "NOT tombstone"
    if settings.kind == "versioned":
        observable = layout.answerable_sql(state.stream_time, settings.history_retention_ms)
    con = storage.duckdb_connect(info.path)
    try:
        rows = con.sql(
            "SELECT key, value, valid_from, \"partition\" FROM (SELECT key, valid_from, valid_to, value, tombstone, "
            f"\"partition\", run FROM read_parquet($files) {read_rule_sql(settings.kind)}) WHERE {observable} "
            "ORDER BY valid_from, key", params={"files": files}).fetchall()
    finally:
        con.close()
    log.info("store %s: derived tables start from its snapshot %d (run %d): %d version(s)", info.name, snapshot,
             run, len(rows))
    return [SourceRecord(k, v, int(t), int(p)) for k, v, t, p in rows]


def _run_pass(spark: SparkSession, pipeline: Pipeline, specs: dict[str, TableSpec], handles: dict[str, StoreHandle],
              infos: dict[str, SourceInfo], sources_of: dict[str, set[str]], start: dict[str, int],
              writers: list[str], reports: dict[str, TableReport]) -> None:
    """Compute one pass and commit its writers in file order, adding each one's report to
    ``reports`` as soon as it is committed."""
    order = [t.name for t in pipeline.tables]
    members = set(writers)
    for name in writers:
        members |= _upstream(specs, name)
    pass_tables = [specs[name] for name in order if name in members]
    pass_sources = set().union(*(sources_of[name] for name in members))
    states: dict[str, TableState] = {}
    readers: list[SnapshotReader] = []
    records: dict[str, list[SourceRecord]] = {}
    try:
        for s in sorted(pass_sources):
            info = infos[s]
            after = start.get(s, 0)
            covered = info.changelog_since is not None and info.changelog_since <= after + 1
            if info.run > after and not info.is_stream and not covered:
                if after:  # a table that consumed runs of this store always had their changelog
                    first = (info.changelog_since or info.run + 1) - 1
                    raise DeriveError(f"store {s!r} has no changelog of runs {after + 1}..{first}; delete the "
                                      "derived tables of this pipeline to rebuild them from the store")
                if info.changelog_since is None:  # its ingest failed before committing to keep one
                    raise DeriveError(f"store {s!r} keeps no changelog yet (its ingest did not complete in this "
                                      "run); run the pipeline again")
                # A store ingested before any table read it: bootstrap from what it holds
                # (docs/derived-tables.md, "Tables added over an existing store"), then go on
                # with its changelog from the first run that kept one.
                upto = info.changelog_since - 1
                records[s] = _bootstrap_records(info, upto) + _read_records(info.path, upto, info.run, False)
            else:
                records[s] = _read_records(info.path, after, info.run, info.is_stream)
            if info.is_stream:
                continue
            snapshot = _snapshot_of_run(info.path, info.snapshot, after) if after else None
            reader = SnapshotReader(info.path, snapshot, info.settings.kind, info.settings.buckets,
                                    info.settings.history_retention_ms)
            readers.append(reader)
            settings = info.settings
            states[s] = TableState(s, settings.kind, settings.history_retention_ms, settings.partitions, reader)
        for spec in pass_tables:
            if spec.is_stream:
                continue
            handle = handles[spec.name]
            if spec.name in writers:
                version = handle.version
            else:
                version = _find_snapshot(handle.path, handle.version,
                                         {s: start.get(s, 0) for s in sources_of[spec.name]})
            reader = SnapshotReader(handle.path, version, spec.kind, spec.buckets, spec.history_retention_ms)
            readers.append(reader)
            states[spec.name] = TableState(spec.name, spec.kind, spec.history_retention_ms, 1, reader)
        topology = Topology(pass_tables, states)
        _prefetch(pass_tables, states, records, topology)
        inputs = [(name, infos[name].is_stream, records[name]) for name in pipeline.inputs if name in records]
        topology.run(inputs)
        log.info("derived pass over %s: %d source record(s)", ", ".join(writers),
                 sum(len(r) for r in records.values()))
        for spec in pass_tables:
            if spec.name in writers:
                reports[spec.name] = _commit(spark, spec, handles, infos, topology.nodes[spec.name],
                                             sources_of[spec.name])
    finally:
        for reader in readers:
            reader.close()


def _prefetch(tables: list[TableSpec], states: dict[str, TableState],
              records: dict[str, list[SourceRecord]], topology: Topology) -> None:
    """Bulk-load the keys the batch will touch where they are known up front (the rest load
    one key at a time on demand)."""
    candidates: dict[str, set[str]] = {name: {r.key for r in recs} for name, recs in records.items()}
    for name, state in states.items():
        if name in records:
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
            left, right = spec.inputs
            left_records = [(r.key, r.value) for r in records.get(left, [])]
            keys = operator.prefetch(candidates.get(left, set()), candidates.get(right, set()), left_records)
        elif spec.op == "aggregate" and spec.group_by is not None:
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


def _emission_table(run: int, emissions: list[Emission]) -> pa.Table:
    return pa.table({
        "run": [run] * len(emissions),
        "sequence": [e.sequence for e in emissions],
        "key": [e.key for e in emissions],
        "value": [e.value for e in emissions],
        "timestamp": [e.timestamp for e in emissions],
        "cause": [e.cause for e in emissions],
    }, schema=EMITTED_SCHEMA)


def _late_table(run: int, node: DerivedNode) -> pa.Table:
    """A derived table's results later than its grace, as ``_rejected`` rows: ``source`` is
    the input that caused the result, ``row`` its emission sequence, ``raw`` the result."""
    stream_time = node.own.stream_time.get(0) if node.own is not None else None
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


def _or_minus_one(version: int | None) -> int:
    return -1 if version is None else version


def _commit(spark: SparkSession, spec: TableSpec, handles: dict[str, StoreHandle], infos: dict[str, SourceInfo],
            node: DerivedNode, sources: set[str]) -> TableReport:
    handle = handles[spec.name]
    run = handle.state.run + 1
    buckets = handle.settings.buckets
    if node.own is None:
        emitted = node.emissions
        rows = pa.table({
            "bucket": [bucket_of(e.key, buckets) for e in emitted],
            "key": [e.key for e in emitted], "value": [e.value for e in emitted],
            "timestamp": [e.timestamp for e in emitted], "run": [run] * len(emitted),
            "seq": [e.sequence for e in emitted],
        }, schema=STREAM_SCHEMA)
    else:
        rows = node.own.changed_rows(run, buckets)
    inputs: dict[str, int] = {}
    for name in spec.inputs:
        snapshot = infos[name].snapshot if name in infos else handles[name].version
        if snapshot is not None:
            inputs[name] = snapshot
    state = StoreState(
        run=run,
        stream_time=dict(node.own.stream_time) if node.own is not None else {},
        sources={s: {"run": infos[s].run, "snapshot": _or_minus_one(infos[s].snapshot)} for s in sorted(sources)},
        inputs=inputs,
        definition=spec.definition,
    )
    # side tables first, the table's commit (data + state) last: docs in versiq.ingest.delta
    emitted = _emission_table(run, node.emissions)
    commit_side(handle.path, EMITTED_DIR, state, local_frame(spark, emitted), empty=emitted.num_rows == 0)
    late = _late_table(run, node)
    commit_side(handle.path, REJECTED_DIR, state, local_frame(spark, late), empty=late.num_rows == 0)
    version = commit_store(handle, local_frame(spark, rows), state)
    c = node.counts
    report = TableReport(kind=spec.kind, emitted=c.emitted, accepted_latest=c.accepted_latest,
                         accepted_out_of_order=c.accepted_out_of_order,
                         replaced_same_timestamp=c.replaced_same_timestamp, tombstones=c.tombstones,
                         snapshot=version, run=run, inputs=dict(state.inputs))
    report.rejected["late"] = c.late
    log.info("table %s: run %d emitted %s -> snapshot %d", spec.name, run, counted(c.emitted, "result"), version)
    return report
