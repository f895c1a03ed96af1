"""``versiq ingest --continuous``: Spark Structured Streaming's file and Kafka sources trigger the runs.

A pipeline whose every store and stream reads a local file or folder or a Kafka topic this
process can read with librdkafka is watched by the kernel's file notifications and a consumer per
topic instead (``ingest.watch``: no streaming query, a run starts within milliseconds of a file
or record landing); the rest of this module is continuous mode for pipelines with an S3 source
or a topic read with Spark's Kafka source (Java-only client settings: ``kafka.driver_config``).

One streaming query watches every source of the pipeline (the ``binaryFile`` file source,
recursive, only the ``path`` column so file contents are not read by the stream; for a Kafka
topic Spark's Kafka source, whose micro-batch rows are never read either: ``ingest.kafka``).
Each micro-batch the sources report (new files landed, new offsets) runs one pipeline run
(``run_pipeline``): every store and stream ingests the files it has not done yet, then the
derived tables catch up, each commit atomic and idempotent.

Two intervals. The query's ``processingTime`` trigger is how often the sources are *checked*
(``--watch-interval``, ``watch_interval``): by default every ``WATCH_INTERVAL_S`` (100 ms) for
local folders and Kafka topics, so a file that lands after a quiet spell starts a run at once.
``--trigger-interval`` is the least time between the starts of two runs that committed
something, so a steady flow of files is still taken in runs at most that often (a run's fixed
cost, one Delta commit per table per run). Before, the trigger was ``--trigger-interval``
itself: Spark fires on multiples of it, so a file waited half an interval on average (2.5 s with
the default 5 s) before its run even started (docs/benchmarks.md, "Freshness: watch fast, run at
most every interval").

A check lists the folders whole, so a folder of many files costs more per check: by default the
watch interval of local folders and Kafka topics adapts, both ways, so that checking takes about
``WATCH_BUDGET`` (a tenth) of a core, judged from Spark's own timing of the checks
(``adapted_watch``; the query is restarted with the new interval between micro-batches). An S3
source is checked every ``--trigger-interval`` unless ``--watch-interval`` is given (each check
is a LIST request, which is billed).

Two checkpoints exist and cannot disagree in a harmful way: the streaming query's own checkpoint
(``<warehouse>/_versiq/continuous/<id>/``) only decides *when* to run, while the set of files
done (or the topic offsets) committed with each store's data decides *what* is ingested. The file source writes a
batch's commit only after ``foreachBatch`` returned, so a crash at any point replays the batch,
and the replayed run skips what the stores already committed. A failed run raises, which stops
the query before its commit; the loop restarts it after ``--trigger-interval`` and the batch is
replayed (so failures are retried even when no new file lands). Between micro-batches the
stores and derived tables that accumulated many files are compacted.

The file source only *lists* the sources (the micro-batch's rows are never read), so it never
opens a FIFO, and a dangling symlink or a symlink loop does not stop it; which files are
sources, ignored or unreadable is decided by the run's own listing (``ingest.sources``), exactly
as in a single run: an unreadable file fails the run, which is replayed until it can be read.
"""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from functools import reduce
from typing import Any

from versiq import storage
from versiq.exits import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from versiq.ingest.errors import UsageError
from versiq.ingest.spark import active_on_this_thread
from versiq.ingest.store import LockTimeout
from versiq.ingest.watch import all_watched, run_watching, wait_until

log = logging.getLogger("versiq.ingest")


BINARY_FILE_SCHEMA = "path string, modificationTime timestamp, length bigint, content binary"

#: How often local folders and Kafka topics are checked for new input (a directory listing, an
#: offsets request to the broker): the wait of a file that lands between runs.
WATCH_INTERVAL_S = 0.1
#: The share of a core that checking the sources may take by default (``adapted_watch``). A check
#: lists the folders whole: measured, a folder of 10,000 files took 0.13-0.22 s per check, so
#: checking it every 100 ms kept a core busy (98%) while nothing landed.
WATCH_BUDGET = 0.1
#: How often Spark reports the progress of a query that finds nothing new (default 10 s), and how
#: often ``_watch`` reads the newest report.
IDLE_PROGRESS_CONF = "spark.sql.streaming.noDataProgressEventInterval"
_LOOK_S = 2.0
_SAMPLES = 3


class RunFailed(RuntimeError):
    """A micro-batch's run reported a failed store/stream/table (the batch will be replayed)."""


def _source_frame(spark: Any, source: str) -> Any:
    reader = (spark.readStream.format("binaryFile").schema(BINARY_FILE_SCHEMA)
              .option("recursiveFileLookup", "true"))
    if storage.is_s3(source):
        files = storage.list_files(source)
        if files is not None and list(files.values()) == [storage.normalize(source)]:  # one object
            reader = reader.option("pathGlobFilter", storage.basename(source))
            source = source.rstrip("/").rsplit("/", 1)[0]
        return reader.load(storage.spark_path(source)).select("path")
    source = os.path.abspath(source)
    if os.path.isfile(source):
        reader = reader.option("pathGlobFilter", os.path.basename(source))
        source = os.path.dirname(source)
    return reader.load(source).select("path")


def _identity(spec: Any) -> str:
    if spec.kafka is not None:
        return str(spec.kafka.identity())
    return storage.normalize(spec.source)


def watch_interval(specs: list[Any], interval_s: float, watch_s: float | None = None) -> float:
    """How often the streaming query checks the sources: ``watch_s`` (``--watch-interval``) when
    given; else ``WATCH_INTERVAL_S``, or the trigger interval when a source is on S3 (a LIST
    request per check). Never less often than the trigger interval."""
    if watch_s is None:
        on_s3 = any(spec.kafka is None and storage.is_s3(spec.source) for spec in specs)
        watch_s = interval_s if on_s3 else WATCH_INTERVAL_S
    return min(interval_s, watch_s)


def watch_adapts(specs: list[Any], interval_s: float, watch_s: float | None) -> bool:
    """Whether the watch interval adapts to what checks cost (``adapted_watch``): only the
    default one below the trigger interval. A ``--watch-interval`` is the user's, kept as it is,
    and S3 sources are checked every trigger interval (LIST requests), never more often."""
    return watch_s is None and watch_interval(specs, interval_s) < interval_s


def adapted_watch(check_s: float, watch_s: float, interval_s: float) -> float | None:
    """The watch interval at which a check of ``check_s`` seconds (Spark's ``latestOffset``
    time) takes ``WATCH_BUDGET`` of a core, between ``WATCH_INTERVAL_S`` and the trigger
    interval; None while it is within a factor of 1.5 of ``watch_s`` either way (a new interval
    restarts the streaming query)."""
    wanted = round(min(interval_s, max(WATCH_INTERVAL_S, check_s / WATCH_BUDGET)), 3)  # the trigger's ms
    if wanted > 1.5 * watch_s or wanted * 1.5 < watch_s:
        return wanted
    return None


def check_cost(checks: Sequence[float]) -> float:
    """What a check of the sources costs, from Spark's timings of recent checks: the quickest.
    A check's own work (listing the folders, asking the broker) is the least it takes; a run
    beside it, Delta's state computed after one, the JIT or another process on the machine only
    make it take longer, and judging on those moments would slow the watch down for nothing."""
    return min(checks)


def _check_seconds(query: Any) -> tuple[str, float] | None:
    """The newest progress report's time and how long its check of the sources took (None
    without one, or when the JVM is gone: a signal to the process group)."""
    try:
        progress = query.lastProgress
    except Exception:  # noqa: BLE001 - the caller's loop ends on the query's state
        return None
    if not progress or "latestOffset" not in progress.get("durationMs", {}):
        return None
    return str(progress["timestamp"]), progress["durationMs"]["latestOffset"] / 1000.0


def _active(query: Any) -> bool:
    """Whether the query runs; False when the JVM is gone (a signal to the process group)."""
    try:
        return bool(query.isActive)
    except Exception:  # noqa: BLE001 - stopping it then says so
        return False


def _watch(query: Any, state: dict[str, Any], watch_s: float, interval_s: float, adaptive: bool) -> float | None:
    """Wait while the query runs and nothing asks it to stop; every ``_LOOK_S`` (``adaptive``)
    look at its newest progress report and return a new watch interval when the sources' checks
    cost more, or much less, than ``WATCH_BUDGET`` of a core (``adapted_watch``), judged on the
    quickest of its last ``_SAMPLES`` reports (``check_cost``). (The median flapped: with a file landing every few
    seconds, two of three checks overlapped a run or Delta's state computed after one, 3 ms
    checks of a 3-file folder measured 41 ms, and the query restarted at 0.4 s and back at
    0.1 s every few seconds.) The first report of a query is not used: its check is a cold one."""
    last, reports = "", 0
    checks: deque[float] = deque(maxlen=_SAMPLES)
    look = time.monotonic() + _LOOK_S
    while not state["stop"] and _active(query):
        time.sleep(0.2)
        if not adaptive or time.monotonic() < look:
            continue
        look = time.monotonic() + _LOOK_S
        sample = _check_seconds(query)
        if sample is None or sample[0] == last:
            continue
        last, reports = sample[0], reports + 1
        if reports == 1:
            continue
        checks.append(sample[1])
        if len(checks) < _SAMPLES:
            continue
        check_s = check_cost(checks)
        wanted = adapted_watch(check_s, watch_s, interval_s)
        if wanted is not None:
            log.info("a check of the sources took %.0f ms (the quickest of %d): checking every %.1fs from now on",
                     check_s * 1000, _SAMPLES, wanted)
            return wanted
    return None


def quiet_batch_failures() -> None:
    """A micro-batch that fails raises out of ``foreachBatch``, which stops the query so that the
    batch is replayed; versiq says why in one line (the run's report, or the log of an unexpected
    error with its traceback). py4j (which logs every exception a Python callback raises, with its
    traceback) and Spark's ``MicroBatchExecution`` (which logs the query's end with the Java and
    Python stack traces, ~150 lines; silenced in ``log4j2.properties``) would say it again, in text
    that also breaks a ``--log-format json`` stream."""
    if not log.isEnabledFor(logging.DEBUG):  # --log-level DEBUG keeps everything (Spark's too)
        logging.getLogger("py4j.clientserver").setLevel(logging.CRITICAL)


def _first_line(error: Any) -> str:
    """The first line of a query's exception (Spark's own text has the stack traces after it)."""
    text = str(error or "").strip()
    return text.splitlines()[0] if text else "no error"


def checkpoint_dir(warehouse: str, sources: list[str]) -> str:
    """The streaming query's checkpoint: one per set of watched sources (paths, or
    ``kafka://bootstrap/topic``), inside the warehouse's private ``_versiq`` directory (never
    listed as a store)."""
    digest = hashlib.sha256("\n".join(sorted(sources)).encode()).hexdigest()[:16]
    return storage.join(storage.normalize(warehouse), "_versiq", "continuous", digest)


def run_continuous(spark: Any, warehouse: str, pipeline: Any, interval_s: float,
                   one_run: Callable[[], Any], after_run: Callable[[Any], None],
                   watch_s: float | None = None) -> int:
    """Run until SIGTERM/SIGINT (finishing the current micro-batch); returns the exit status.

    ``one_run()`` runs the pipeline once and returns its ``RunReport``; ``after_run(report)``
    prints/writes it and does maintenance. ``interval_s``: ``--trigger-interval``; ``watch_s``:
    ``--watch-interval`` (None: ``watch_interval``'s default).
    """
    specs = [*pipeline.stores, *pipeline.streams]
    if all_watched(specs):  # file notifications and topic consumers say when, no streaming query
        return run_watching(warehouse, specs, interval_s, watch_interval(specs, interval_s, watch_s), one_run,
                            after_run, catch_up=bool(pipeline.tables))
    from versiq.ingest.kafka import trigger_frame

    frames = [trigger_frame(spark, spec.kafka) if spec.kafka is not None
              else _source_frame(spark, spec.source) for spec in specs]
    frame = reduce(lambda a, b: a.union(b), frames)
    checkpoint = checkpoint_dir(warehouse, [_identity(spec) for spec in specs])
    storage.ensure_dir(checkpoint)
    busy = threading.Lock()
    # next_run: the earliest start of the next run (``--trigger-interval`` after the start of the
    # last one that committed something)
    # pause: the query is being replaced by one with another watch interval (batches refuse)
    # failure: why the last micro-batch failed, in versiq's words
    state: dict[str, Any] = {"stop": False, "pause": False, "status": EXIT_OK, "fatal": None, "next_run": 0.0,
                             "failure": None}
    quiet_batch_failures()
    adaptive = watch_adapts(specs, interval_s, watch_s)
    watch_s = watch_interval(specs, interval_s, watch_s)
    log.info("watching %d source(s) every %.1fs; a run at most every %.1fs", len(specs), watch_s, interval_s)
    if adaptive and spark.conf.get(IDLE_PROGRESS_CONF, None) is None:
        spark.conf.set(IDLE_PROGRESS_CONF, f"{int(_LOOK_S * 1000)}ms")  # an idle query's checks timed every 2 s

    def refusing() -> bool:
        return bool(state["stop"] or state["pause"])

    def on_batch(batch: Any, batch_id: int) -> None:
        with busy:
            try:
                _on_batch(batch_id)
            except RunFailed as exc:
                state["failure"] = str(exc)
                raise
            except (UsageError, LockTimeout) as exc:
                state["failure"] = str(exc)
                state["fatal"] = exc
                state["stop"] = True
                raise
            except Exception as exc:
                # py4j's and Spark's own reports of it are silenced (``quiet_batch_failures``)
                log.exception("micro-batch %d failed", batch_id)
                state["failure"] = f"{type(exc).__name__}: {exc}"
                raise

    def _on_batch(batch_id: int) -> None:
        if not wait_until(state["next_run"], refusing):
            raise RunFailed("stopping or restarting: the batch is left for the next start")
        started = time.monotonic()
        state["status"] = EXIT_FAILED  # until the run and its report are through
        with active_on_this_thread(spark):  # not the query's clone of it (its settings then)
            report = one_run()
            if report.committed:
                state["next_run"] = started + interval_s
            after_run(report)
        state["status"] = EXIT_FAILED if report.failed else EXIT_OK
        if report.failed:
            raise RunFailed("a store, stream or table failed; the micro-batch will be retried")
        log.info("micro-batch %d done", batch_id)

    def _stop(signum: int, _frame: Any) -> None:
        log.info("signal %d: stopping after the current micro-batch", signum)
        state["stop"] = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    while not state["stop"]:
        # a failed micro-batch stops its query, so a failure belongs to the query that ends next
        # (which may fail before its first micro-batch: a source's check)
        state["failure"] = None
        query = (frame.writeStream.foreachBatch(on_batch).option("checkpointLocation", storage.spark_path(checkpoint))
                 .trigger(processingTime=f"{max(1, int(watch_s * 1000))} milliseconds")
                 .queryName(f"versiq-ingest-{storage.basename(checkpoint)}").start())
        retune = _watch(query, state, watch_s, interval_s, adaptive)
        # Let a running micro-batch finish its run; one that starts from now on refuses at once
        # (``stop`` or ``pause`` is set). ``busy`` is not held across ``query.stop()``: that waits
        # for the stream's thread, which may be calling ``on_batch`` for a new batch, and
        # ``on_batch`` waiting for ``busy`` would never return (a deadlock seen when a file was
        # listed just as SIGTERM came).
        state["pause"] = retune is not None
        with busy:
            pass
        try:
            query.stop()
        except Exception:  # noqa: BLE001 - the JVM may already be gone (signal to the group)
            log.warning("the file-stream query did not stop cleanly", exc_info=True)
            return int(state["status"])
        state["pause"] = False
        if state["fatal"] is not None:
            exc = state["fatal"]
            print(f"versiq ingest: error: {exc}", flush=True, file=sys.stderr)
            return EXIT_USAGE if isinstance(exc, UsageError) else EXIT_FAILED
        if retune is not None:
            watch_s = retune
            if state["status"] == EXIT_OK:
                continue  # no failed run to retry after a pause: the new query starts at once
        if not state["stop"]:
            error = query.exception()
            why = state["failure"] or _first_line(error)
            log.warning("the file-stream query stopped (%s); restarting in %.1fs", why, interval_s)
            if not state["failure"]:
                log.debug("the query's error: %s", error)
            wait_until(time.monotonic() + interval_s, lambda: bool(state["stop"]))
    return int(state["status"])
