"""``versiq ingest --continuous`` over local sources and Kafka topics: the kernel says when a
file lands, a consumer when a record does.

When every store and stream of the pipeline reads a local file or folder or a Kafka topic that
this process can read with librdkafka (``topic_watch.watchable``), no streaming query watches
them: the kernel's file notifications (``versiq.notify``) and a consumer per topic
(``topic_watch.TopicChanges``) wake the loop, and a run starts as soon as the sources list a
file that was not there at the last run or a record landed. Spark's streaming query, which
continuous mode keeps for S3 sources and topics read with the Java client (``ingest.continuous``),
cost a file that landed about 0.2 s before its run began: its check every 100 ms, the offsets
it writes to its checkpoint, the micro-batch's planning and the call back into Python (measured:
0.05-0.15 s from landing to the offsets file, 0.07-0.1 s from there to the run), a fifth of the
file's time to being served; and checking a 3-file folder every 100 ms took 6% of a core while
nothing landed. A notification costs nothing while nothing lands.

The sources' own listing (``sources.list_sources``) stays the truth for what a run reads, and the
files done or the topic positions, committed with each table's data, for what is new: a
notification only says *when* to run. Nothing is kept outside the tables (no checkpoint): at
start the files done are read from each table's newest commit, a pipeline with a topic runs once
(records that landed while the ingest was stopped), and a file that landed meanwhile starts a
run at once. The sources are also listed every ``--trigger-interval`` whatever the kernel says
(a notification queue can overflow), and every ``--watch-interval`` (default 100 ms) where the
kernel cannot notify (a file system without inotify, too many watches).

A run that fails (``report.failed``: an unreadable file, a derived table that failed...) is
logged in one line and retried every ``--trigger-interval`` until it succeeds, even when nothing
lands; a pipeline with derived tables runs once at start, so that tables a stopped ingest left
behind their inputs catch up without waiting for a new file (a streaming query replayed its
unfinished batch); a refused setting (``UsageError``) or a lock held too long ends continuous
mode. As with a streaming query, runs start at most every ``--trigger-interval`` after the start
of the last one that committed something. SIGTERM/SIGINT stop after the current run.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from versiq import layout, storage
from versiq.exits import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from versiq.ingest.errors import LockTimeout, UsageError
from versiq.ingest.kafka import KafkaSourceError
from versiq.ingest.sources import SourceError, hidden_name, list_sources
from versiq.ingest.topic_watch import TopicChanges, watchable
from versiq.notify import FileChanges

log = logging.getLogger("versiq.ingest")


def all_watched(specs: list[Any]) -> bool:
    """Whether every store and stream reads a local file or folder or a topic a consumer of this
    process can watch (``topic_watch.watchable``): continuous mode needs no streaming query."""
    return all(watchable(spec.kafka) if spec.kafka is not None else not storage.is_s3(spec.source)
               for spec in specs)


def _visible(roots: list[str]) -> Callable[[str], bool]:
    """Whether a change at a path under one of the source ``roots`` may be a source file: no
    name below the root is hidden (``.`` or ``_`` first, never listed by
    ``sources.list_sources``), so a file written under a hidden name and renamed into place wakes
    the loop once, at the rename. A source that is a file: any change of it."""

    prefixes = [(root, root.rstrip(os.sep) + os.sep) for root in roots]

    def keep(path: str) -> bool:
        for root, prefix in prefixes:
            if path == root:
                return True
            if path.startswith(prefix):
                return not any(hidden_name(part) for part in path[len(prefix):].split(os.sep))
        return True

    return keep


def _listed(specs: list[Any]) -> set[tuple[str, str]] | None:
    """(table, file) for every file the sources list now; None when a source cannot be listed
    (a dangling symlink, an unreadable folder): a run is due, which says why and is retried."""
    listed: set[tuple[str, str]] = set()
    for spec in specs:
        if spec.kafka is not None:
            continue
        try:
            listed.update((spec.name, rel) for rel in list_sources(spec.source).files)
        except (SourceError, OSError):
            return None
    return listed


def _done(warehouse: str, specs: list[Any]) -> set[tuple[str, str]]:
    """(table, file) for every file the tables' newest commits have done (no table: none)."""
    done: set[tuple[str, str]] = set()
    for spec in specs:
        if spec.kafka is not None:
            continue
        path = layout.table_path(warehouse, spec.name)
        try:
            if layout.has_table(path):
                state = layout.read_state(path, storage.delta_table(path).version())
                done.update((spec.name, rel) for rel in state.done_files)
        except Exception as exc:  # noqa: BLE001 - the first run reads the table and reports it
            log.debug("could not read the files done of %s: %s", spec.name, exc)
    return done


#: How often a wait looks at whether a signal asked to stop (the handlers only set a flag: a lock
#: taken in a signal handler can be the one its own thread holds).
STOP_CHECK_S = 0.05


def wait_until(deadline: float, stopping: Callable[[], bool],
               woken: Callable[[float], bool] | None = None) -> bool:
    """Until ``deadline`` (``time.monotonic``) or, with ``woken`` (a wait of at most its argument
    that says whether something happened: ``FileChanges.wait``), something happening; False as
    soon as ``stopping()`` (checked every ``STOP_CHECK_S``)."""
    while not stopping():
        left = deadline - time.monotonic()
        if left <= 0:
            return True
        if woken is None:
            time.sleep(min(left, STOP_CHECK_S))
        elif woken(min(left, STOP_CHECK_S)):
            return True
    return False


def run_watching(warehouse: str, specs: list[Any], interval_s: float, watch_s: float,
                 one_run: Callable[[], Any], after_run: Callable[[Any], None], catch_up: bool = False) -> int:
    """Run until SIGTERM/SIGINT (finishing the current run); returns the exit status (module
    docstring). ``one_run()`` runs the pipeline once and returns its ``RunReport``;
    ``after_run(report)`` prints/writes it and does maintenance; ``catch_up``: run once at start
    even when no source holds anything new (a pipeline with derived tables). A topic that cannot
    be watched yet (its broker does not answer) is asked again every ``interval_s``."""
    stopping = {"stop": False}

    def _stop(signum: int, _frame: Any) -> None:
        log.info("signal %d: stopping after the current run", signum)
        stopping["stop"] = True

    def stopped() -> bool:
        return stopping["stop"]

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    paths = sorted({os.path.abspath(spec.source) for spec in specs if spec.kafka is None})
    sources = [spec.kafka for spec in specs if spec.kafka is not None]
    topics = _topic_changes(sources, interval_s, stopped) if sources else None  # before the first run
    if sources and topics is None:
        return EXIT_OK  # stopped while the broker did not answer
    changes: FileChanges | None = None
    try:
        if paths:
            changes = FileChanges(paths, "the sources", keep=_visible(paths))
        log.info("watching %s; a run at most every %.1fs", _watched(len(paths), len(sources)), interval_s)
        return _loop(warehouse, specs, interval_s, watch_s, one_run, after_run, catch_up, changes, topics, stopped)
    finally:
        for watch in (changes, topics):
            if watch is not None:
                watch.close()


def _topic_changes(sources: list[Any], interval_s: float, stopped: Callable[[], bool]) -> TopicChanges | None:
    """The topics' watch, asked again every ``interval_s`` while a broker does not answer (said in
    one line each time, as a streaming query's failed check was); None when stopped meanwhile."""
    while True:
        try:
            return TopicChanges(sources)
        except KafkaSourceError as exc:
            log.warning("%s; trying again in %.1fs", exc, interval_s)
        if not wait_until(time.monotonic() + interval_s, stopped):
            return None


def _loop(warehouse: str, specs: list[Any], interval_s: float, watch_s: float, one_run: Callable[[], Any],
          after_run: Callable[[Any], None], catch_up: bool, changes: FileChanges | None,
          topics: TopicChanges | None, stopped: Callable[[], bool]) -> int:
    """``run_watching``'s runs, until ``stopped()``."""
    # records: a record landed since the last run started (a run at start reads what landed before)
    landed = {"records": topics is not None}

    def woken(timeout_s: float) -> bool:
        files = changes is not None and changes.wait(0.0 if topics is not None else timeout_s)
        if topics is not None and topics.wait(timeout_s):
            landed["records"] = True
        return files or landed["records"]

    status = EXIT_OK
    seen = _done(warehouse, specs)
    retry = catch_up  # run even with nothing new: at start (catch_up), and after a failed run
    next_run = 0.0  # the earliest start of the next run
    while not stopped():
        listed = _listed(specs)
        if not retry and not landed["records"] and listed is not None and listed <= seen:
            notified = changes is None or changes.notified
            wait_until(time.monotonic() + (interval_s if notified else min(watch_s, interval_s)), stopped, woken)
            continue
        if not wait_until(next_run, stopped):
            break
        if topics is not None:
            topics.rearm()  # the run reads what landed so far; what lands from now on wakes the next
            landed["records"] = False
        started = time.monotonic()
        try:
            report = one_run()
            if report.committed:
                next_run = started + interval_s
            after_run(report)
        except (UsageError, LockTimeout) as exc:
            print(f"versiq ingest: error: {exc}", flush=True, file=sys.stderr)
            return EXIT_USAGE if isinstance(exc, UsageError) else EXIT_FAILED
        except Exception:  # noqa: BLE001 - logged with its traceback, retried after the interval
            log.exception("the run failed; retrying in %.1fs", interval_s)
            status, retry, next_run = EXIT_FAILED, True, time.monotonic() + interval_s
            continue
        if report.failed:
            log.warning("the run failed (a store, stream or table failed); retrying in %.1fs", interval_s)
            status, retry = EXIT_FAILED, True
            next_run = max(next_run, time.monotonic() + interval_s)
        else:
            status, retry = EXIT_OK, False
            if listed is None:  # the listing failed and the run's own went through: what the commits say
                seen |= _done(warehouse, specs)
                next_run = max(next_run, time.monotonic() + watch_s)  # never back to back on a flaky listing
            else:  # what was listed before the run is done now
                seen |= listed
    return status


def _watched(folders: int, topics: int) -> str:
    """The log's words for what is watched."""
    parts = ([f"{folders} local source(s) for new files (file notifications)"] if folders else []) \
        + ([f"{topics} Kafka topic(s) for new records (a consumer each)"] if topics else [])
    return " and ".join(parts)
