"""System time: the commits of a store or stream (its snapshots) as the Delta log records them,
and which snapshot was current at a given wall-clock time.

Every commit of a versiq table is one snapshot (``versiq.layout``), so "what did we believe at
T1 about the value at T2?" is a read of the newest snapshot committed at or before T1
(``snapshot_at``) as of T2. The log is the only source: each ``_delta_log/N.json`` holds the
commit's time (``commitInfo.timestamp``, the writer's clock, epoch ms), the store state versiq
put in it (``userMetadata``: run, done files, Kafka position) and what kind of write it was. A
commit is

- ``ingest``: a run of a source store or stream: an append carrying versiq's state (Delta's
  ``WRITE`` in ``Append`` mode; the transaction ``versiq.ingest`` where a run has one,
  ``versiq.ingest.delta.run_txn_needed``);
- ``derive``: a run of a derived table (the same, on a table with a definition);
- ``settings``: a commit of state only, between runs (transaction ``versiq.state``: a changelog
  turned on, a Kafka topic's new partitions);
- ``erase``: ``versiq erase`` removed keys (transaction ``versiq.erase``); its files hold the
  other keys' rows it rewrote, not changes;
- ``maintain``: anything else (compaction, vacuum, table properties), which changes no answer.

Commit files are immutable, so parsed commits are cached by (table, version) for the life of
the process. Commits whose JSON file Delta's log cleanup removed (only checkpoints remain)
are not listed: history reaches back as far as the log does.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from typing import Any

from versiq import layout, storage

INGEST, DERIVE, SETTINGS, ERASE, MAINTAIN = "ingest", "derive", "settings", "erase", "maintain"
_COMMIT_FILE = re.compile(r"(\d{20})\.json\Z")


@dataclass(frozen=True)
class Commit:
    """One snapshot as its commit recorded it."""

    snapshot: int
    #: Epoch ms of the commit (``commitInfo.timestamp``).
    committed_at: int
    operation: str
    #: The run the snapshot's state names (0 before the first run).
    run: int
    #: Rows written and files added/removed by the commit (from its add/remove actions).
    counts: dict[str, int] = field(default_factory=dict)
    #: Files of an ingest or derive commit's run that no earlier snapshot had done (file sources).
    files: tuple[str, ...] = ()
    #: Kafka sources: ``{"topic", "topicId", "nextOffsets": {partition: offset}}`` after the
    #: commit; ``topicId`` (Kafka's id of the topic those offsets belong to) when the position has one.
    kafka: dict[str, Any] | None = None
    #: Delta's own name of the operation (``WRITE``, ``VACUUM END``, ...), for the curious.
    delta_operation: str | None = None
    #: The data files the commit added (add-action paths, relative to the table).
    added_files: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Parsed:
    committed_at: int
    delta_operation: str | None
    app_ids: frozenset[str]
    state: layout.StoreState | None
    rows: int
    added: int
    removed: int
    #: The data files the commit added (their paths as the log has them).
    add_paths: tuple[str, ...] = ()
    #: A plain append (Delta's ``WRITE`` in ``Append`` mode): versiq appends only for runs.
    append: bool = False


_cache: dict[tuple[str, int], _Parsed] = {}
_cache_lock = threading.Lock()


def _parse(text: str) -> _Parsed:
    info: dict[str, Any] = {}
    app_ids: set[str] = set()
    rows = added = removed = 0
    add_paths: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        action = json.loads(line)
        if "commitInfo" in action:
            info = action["commitInfo"]
        elif "txn" in action:
            app_ids.add(str(action["txn"].get("appId")))
        elif "add" in action:
            added += 1
            add_paths.append(str(action["add"]["path"]))
            stats = action["add"].get("stats")
            if stats:
                rows += int(json.loads(stats).get("numRecords", 0))
        elif "remove" in action:
            removed += 1
    text_state = info.get(layout.STATE_KEY, info.get(layout.LEGACY_STATE_KEY))
    state = layout.StoreState.from_json(text_state) if text_state else None
    append = info.get("operation") == "WRITE" and (info.get("operationParameters") or {}).get("mode") == "Append"
    return _Parsed(int(info.get("timestamp", 0)), info.get("operation"), frozenset(app_ids), state, rows, added,
                   removed, tuple(add_paths), append)


def _commit(table_path: str, version: int) -> _Parsed:
    key = (table_path, version)
    with _cache_lock:
        hit = _cache.get(key)
    if hit is not None:
        return hit
    parsed = _parse(storage.read_text(layout.log_file(table_path, version)))
    with _cache_lock:
        _cache[key] = parsed
    return parsed


def _operation(parsed: _Parsed, derived: bool) -> str:
    if layout.STATE_APP_ID in parsed.app_ids:
        return SETTINGS
    if layout.ERASE_APP_ID in parsed.app_ids:
        return ERASE
    if layout.APP_ID in parsed.app_ids or (parsed.append and parsed.state is not None):
        return DERIVE if derived else INGEST
    return MAINTAIN


def commits(table_path: str, newest: int) -> list[Commit]:
    """The commits of the table at ``table_path`` up to snapshot ``newest``, newest first."""
    try:
        names = storage.listdir(layout.delta_log(table_path))
    except FileNotFoundError:
        return []
    versions = sorted(int(m.group(1)) for m in map(_COMMIT_FILE.match, names) if m and int(m.group(1)) <= newest)
    out: list[Commit] = []
    state = layout.StoreState()
    done: set[str] = set()
    for version in versions:
        parsed = _commit(table_path, version)
        if parsed.state is not None:
            state = parsed.state
        derived = state.definition is not None
        operation = _operation(parsed, derived)
        new_files = tuple(sorted(set(state.done_files) - done)) if operation in (INGEST, DERIVE) else ()
        done = set(state.done_files)
        kafka = None
        if state.kafka is not None:
            position = state.kafka.to_dict()
            kafka = {name: value for name, value in position.items() if name in ("topic", "topicId", "nextOffsets")}
        out.append(Commit(version, parsed.committed_at, operation, state.run,
                          {"rowsWritten": parsed.rows, "filesAdded": parsed.added, "filesRemoved": parsed.removed},
                          new_files, kafka, parsed.delta_operation, parsed.add_paths))
    out.reverse()
    return out


def snapshot_at(table_path: str, newest: int, system_time: int) -> int | None:
    """The newest snapshot (``<= newest``) committed at or before ``system_time`` (epoch ms);
    None when the table's first listed commit is later."""
    for commit in commits(table_path, newest):
        if commit.committed_at <= system_time:
            return commit.snapshot
    return None
