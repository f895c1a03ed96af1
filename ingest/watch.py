"""``versiq ingest --continuous``: the kernel says when a file lands, a consumer when a record
does, and each time the pipeline runs once.

Local files and folders are watched by the kernel's file notifications (``versiq.notify``); a
Kafka topic that this process can read with librdkafka (``topic_watch.watchable``) by a consumer
(``topic_watch.TopicChanges``): a run starts within milliseconds of a file or record landing,
and watching costs nothing while nothing lands. What cannot notify is polled every watch interval
(``watch_interval``: ``--watch-interval``, default ``WATCH_INTERVAL_S``): an S3 source is listed
(a LIST request, billed: by default once per ``--trigger-interval``), a topic whose client
settings only the Java client takes has its end offsets asked through the session's JVM
(``topic_watch.TopicPolls``), and a local folder where the kernel cannot notify (a file system
without inotify, too many watches) is listed; a folder the kernel watches is listed only when it
reports a change. A listing that uses much CPU is repeated less often (``LISTING_SHARE``), never
less often than every trigger interval.

The sources' own listing (``sources.list_sources``) stays the truth for what a run reads, and the
files done or the topic positions, committed with each table's data, for what is new: a
notification only says *when* to run. Nothing is kept outside the tables (no checkpoint): at
start the files done are read from each table's newest commit, a pipeline with a topic runs once
(records that landed while the ingest was stopped), and a file that landed meanwhile starts a
run at once. The sources are also listed every ``--trigger-interval`` whatever the kernel says
(a notification queue can overflow).

A run that fails (``report.failed``: an unreadable file, a derived table that failed...) is
logged in one line and retried every ``--trigger-interval`` until it succeeds, even when nothing
lands; a pipeline with derived tables runs once at start, so that tables a stopped ingest left
behind their inputs catch up without waiting for a new file; a refused setting (``UsageError``)
or a lock held too long ends continuous mode. Runs start at most every ``--trigger-interval``
after the start of the last one that committed something. SIGTERM/SIGINT stop after the current
run. (A Spark streaming query watched these sources before: docs/benchmarks.md, "A topic's
records wake the runs", has what it cost.)
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from versiq import layout, storage
from versiq.exits import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from versiq.ingest.errors import LockTimeout, UsageError
from versiq.ingest.kafka import KafkaSourceError
from versiq.ingest.sources import SourceError, hidden_name, list_sources
from versiq.ingest.topic_watch import TopicChanges, TopicPolls, watchable
from versiq.notify import FileChanges

log = logging.getLogger("versiq.ingest")


#: How often what cannot notify is checked for new input by default (``watch_interval``): the
#: wait of a file that lands on a file system without notifications, or of a record in a topic
#: polled with the Java client (an offsets request to the broker each).
WATCH_INTERVAL_S = 0.1
#: The share of a core continuous mode spends listing sources to find what cannot notify: a
#: listing that used L seconds of CPU is not repeated within L / LISTING_SHARE
#: (``listing_pause``), so that a folder of 10,000 files on a file system without notifications
#: (about 75 ms of CPU a listing) is not listed ten times a second at the cost of most of a core.
#: Waiting on the network (an S3 LIST request) costs no CPU and stretches nothing; folders the
#: kernel watches are not listed at each check (``_Listing``). The loop's other checks (a polled
#: topic's end offsets) go at the same pace.
LISTING_SHARE = 0.05


def watch_interval(specs: list[Any], interval_s: float, watch_s: float | None = None) -> float:
    """How often what cannot notify is checked: ``watch_s`` (``--watch-interval``) when given;
    else ``WATCH_INTERVAL_S``, or the trigger interval when a source is on S3 (a LIST request
    per check, billed). Never less often than the trigger interval."""
    if watch_s is None:
        watch_s = interval_s if any(_on_s3(spec) for spec in specs) else WATCH_INTERVAL_S
    return min(interval_s, watch_s)


def listing_pause(watch_s: float, interval_s: float, listing_s: float) -> float:
    """How long the loop waits before it checks again what cannot notify, after a listing of
    the sources that used ``listing_s`` seconds of CPU: ``watch_s``, or longer for a costly
    listing (``LISTING_SHARE``), but never longer than the trigger interval ``interval_s``, when
    every source is listed anyway."""
    return min(interval_s, max(watch_s, listing_s / LISTING_SHARE))


def _on_s3(spec: Any) -> bool:
    return spec.kafka is None and storage.is_s3(spec.source)


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


class _Listing:
    """What the sources list now, for the loop's checks. The local folders the kernel watches
    (``changes`` notified) are listed again only when it reported a change (``changed``, set by
    the loop's wake-up) or a trigger interval passed; the sources that cannot notify (S3, folders
    it cannot watch) at every check. ``cpu_s``: the CPU time the last check spent listing those
    (``listing_pause``): waiting on S3's answers costs none."""

    def __init__(self, specs: list[Any], changes: FileChanges | None, interval_s: float) -> None:
        files = [spec for spec in specs if spec.kafka is None]
        self._local = [spec for spec in files if not _on_s3(spec)]
        self._s3 = [spec for spec in files if _on_s3(spec)]
        self._changes = changes
        self._interval_s = interval_s
        self._watched: set[tuple[str, str]] | None = None
        self._listed_at = 0.0
        self.changed = True
        self.cpu_s = 0.0

    def now(self) -> set[tuple[str, str]] | None:
        """``_listed`` of every file source (None: one cannot be listed)."""
        watched = self._changes is not None and self._changes.notified
        if watched and (self.changed or self._watched is None
                        or time.monotonic() - self._listed_at >= self._interval_s):
            self.changed = False  # a change reported from now on lists them again
            self._listed_at = time.monotonic()
            self._watched = _listed(self._local)
        started = time.thread_time()
        rest = _listed(self._s3 + ([] if watched else self._local))
        self.cpu_s = time.thread_time() - started
        if rest is None or (watched and self._watched is None):
            return None
        return rest | (self._watched or set()) if watched else rest


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


def run_continuous(spark: Any, warehouse: str, pipeline: Any, interval_s: float, one_run: Callable[[], Any],
                   after_run: Callable[[Any], None], watch_s: float | None = None) -> int:
    """``versiq ingest --continuous`` over ``pipeline``: ``run_watching`` of its stores and streams,
    what cannot notify checked every ``watch_interval`` (``watch_s``: ``--watch-interval``), a
    catch-up run at start when it has derived tables, topics only the Java client reads polled
    through ``spark``'s JVM. ``interval_s``: ``--trigger-interval``."""
    specs = [*pipeline.stores, *pipeline.streams]
    return run_watching(warehouse, specs, interval_s, watch_interval(specs, interval_s, watch_s), one_run,
                        after_run, catch_up=bool(pipeline.tables), spark=spark)


def run_watching(warehouse: str, specs: list[Any], interval_s: float, watch_s: float,
                 one_run: Callable[[], Any], after_run: Callable[[Any], None], catch_up: bool = False,
                 spark: Any = None) -> int:
    """Run until SIGTERM/SIGINT (finishing the current run); returns the exit status (module
    docstring). ``one_run()`` runs the pipeline once and returns its ``RunReport``;
    ``after_run(report)`` prints/writes it and does maintenance; ``watch_s``: how often what
    cannot notify is checked (``watch_interval``); ``catch_up``: run once at start even when no
    source holds anything new (a pipeline with derived tables); ``spark``: the session whose JVM
    polls topics only the Java client can read. A topic that cannot be watched yet (its broker
    does not answer) is asked again every ``interval_s``."""
    stopping = {"stop": False}

    def _stop(signum: int, _frame: Any) -> None:
        log.info("signal %d: stopping after the current run", signum)
        stopping["stop"] = True

    def stopped() -> bool:
        return stopping["stop"]

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    paths = sorted({os.path.abspath(spec.source) for spec in specs if spec.kafka is None and not _on_s3(spec)})
    sources = [spec.kafka for spec in specs if spec.kafka is not None]
    consumed = [source for source in sources if watchable(source)]
    polled = [source for source in sources if not watchable(source)]
    topics: TopicChanges | None = None
    polls: TopicPolls | None = None
    changes: FileChanges | None = None
    try:  # the topics' watches before the first run
        if consumed and (topics := _asked(lambda: TopicChanges(consumed), interval_s, stopped)) is None:
            return EXIT_OK  # stopped while a broker did not answer
        if polled and (polls := _asked(lambda: TopicPolls(spark, polled), interval_s, stopped)) is None:
            return EXIT_OK
        if paths:
            changes = FileChanges(paths, "the sources", keep=_visible(paths))
        on_s3 = sum(1 for spec in specs if _on_s3(spec))
        log.info("watching %s; a run at most every %.1fs", _watched(len(paths), len(consumed), len(polled), on_s3,
                                                                    watch_s), interval_s)
        watches = _Watches(changes, topics, polls, polling=bool(polled or on_s3))
        return _loop(warehouse, specs, interval_s, watch_s, one_run, after_run, catch_up, watches, stopped)
    finally:
        for watch in (changes, topics, polls):
            if watch is not None:
                watch.close()


T = TypeVar("T")


def _asked(make: Callable[[], T], interval_s: float, stopped: Callable[[], bool]) -> T | None:
    """A topics' watch (``make()``), asked again every ``interval_s`` while a broker does not
    answer (said in one line each time); None when stopped meanwhile."""
    while True:
        try:
            return make()
        except KafkaSourceError as exc:
            log.warning("%s; trying again in %.1fs", exc, interval_s)
        if not wait_until(time.monotonic() + interval_s, stopped):
            return None


@dataclass
class _Watches:
    """What says that a run is due: the kernel for local sources (``changes``), a consumer per
    topic librdkafka reads (``topics``), the Java client's end offsets for the other topics
    (``polls``); ``polling``: something must be checked every watch interval (an S3 source or a
    polled topic)."""

    changes: FileChanges | None
    topics: TopicChanges | None
    polls: TopicPolls | None
    polling: bool

    def notified(self) -> bool:
        """Whether every source that is listed tells when it changes: no need to list them
        more often than every trigger interval."""
        return not self.polling and (self.changes is None or self.changes.notified)


def _loop(warehouse: str, specs: list[Any], interval_s: float, watch_s: float, one_run: Callable[[], Any],
          after_run: Callable[[Any], None], catch_up: bool, watches: _Watches, stopped: Callable[[], bool]) -> int:
    """``run_watching``'s runs, until ``stopped()``."""
    changes, topics, polls = watches.changes, watches.topics, watches.polls
    # records: a record landed since the last run started (a run at start reads what landed before)
    landed = {"records": topics is not None or polls is not None}

    listing = _Listing(specs, changes, interval_s)

    def woken(timeout_s: float) -> bool:
        files = changes is not None and changes.wait(0.0 if topics is not None else timeout_s)
        if files:
            listing.changed = True
        if topics is not None and topics.wait(timeout_s):
            landed["records"] = True
        return files or landed["records"]

    status = EXIT_OK
    seen = _done(warehouse, specs)
    retry = catch_up  # run even with nothing new: at start (catch_up), and after a failed run
    next_run = 0.0  # the earliest start of the next run
    stretched = False  # the log said once that a costly listing stretches the checks
    while not stopped():
        if polls is not None and polls.changed():
            landed["records"] = True
        listed = listing.now()
        if not retry and not landed["records"] and listed is not None and listed <= seen:
            notified = watches.notified()
            pause = interval_s if notified else listing_pause(watch_s, interval_s, listing.cpu_s)
            if not notified and pause > watch_s and not stretched:
                stretched = True
                log.info("listing the sources used %.0f ms of CPU: what cannot notify is checked every %.2fs, "
                         "not every %.2fs", listing.cpu_s * 1000, pause, watch_s)
            wait_until(time.monotonic() + pause, stopped,
                       woken if changes is not None or topics is not None else None)  # else a plain sleep
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


def _watched(folders: int, consumed: int, polled: int, on_s3: int, watch_s: float) -> str:
    """The log's words for what is watched."""
    parts = ([f"{folders} local source(s) for new files (file notifications)"] if folders else []) \
        + ([f"{consumed} Kafka topic(s) for new records (a consumer each)"] if consumed else []) \
        + ([f"{polled} Kafka topic(s) for new records (their end offsets every {watch_s:.1f}s)"] if polled else []) \
        + ([f"{on_s3} S3 source(s) for new objects (listed every {watch_s:.1f}s)"] if on_s3 else [])
    return " and ".join(parts)
