"""``versiq ingest --continuous``: Spark Structured Streaming's file and Kafka sources trigger the runs.

One streaming query watches every source of the pipeline (the ``binaryFile`` file source,
recursive, only the ``path`` column so file contents are not read by the stream; for a Kafka
topic Spark's Kafka source, whose micro-batch rows are never read either: ``ingest.kafka``)
with a ``processingTime`` trigger of ``--trigger-interval``. Each micro-batch the file source reports
(new files landed) runs one pipeline run (``run_pipeline``): every store and stream ingests the
files it has not done yet, then the derived tables catch up, each commit atomic and idempotent.

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
from collections.abc import Callable
from functools import reduce
from typing import Any

from versiq import storage
from versiq.exits import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from versiq.ingest.errors import UsageError
from versiq.ingest.store import LockTimeout

log = logging.getLogger("versiq.ingest")


BINARY_FILE_SCHEMA = "path string, modificationTime timestamp, length bigint, content binary"


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


def checkpoint_dir(warehouse: str, sources: list[str]) -> str:
    """The streaming query's checkpoint: one per set of watched sources (paths, or
    ``kafka://bootstrap/topic``), inside the warehouse's private ``_versiq`` directory (never
    listed as a store)."""
    digest = hashlib.sha256("\n".join(sorted(sources)).encode()).hexdigest()[:16]
    return storage.join(storage.normalize(warehouse), "_versiq", "continuous", digest)


def run_continuous(spark: Any, warehouse: str, pipeline: Any, interval_s: float,
                   one_run: Callable[[], Any], after_run: Callable[[Any], None]) -> int:
    """Run until SIGTERM/SIGINT (finishing the current micro-batch); returns the exit status.

    ``one_run()`` runs the pipeline once and returns its ``RunReport``; ``after_run(report)``
    prints/writes it and does maintenance.
    """
    from versiq.ingest.kafka import trigger_frame

    specs = [*pipeline.stores, *pipeline.streams]
    frames = [trigger_frame(spark, spec.kafka) if spec.kafka is not None
              else _source_frame(spark, spec.source) for spec in specs]
    frame = reduce(lambda a, b: a.union(b), frames)
    checkpoint = checkpoint_dir(warehouse, [_identity(spec) for spec in specs])
    storage.ensure_dir(checkpoint)
    busy = threading.Lock()
    state: dict[str, Any] = {"stop": False, "status": EXIT_OK, "fatal": None}

    def on_batch(batch: Any, batch_id: int) -> None:
        with busy:
            if state["stop"]:
                raise RunFailed("stopping: the batch is left for the next start")
            try:
                report = one_run()
            except (UsageError, LockTimeout) as exc:
                state["fatal"] = exc
                state["stop"] = True
                raise
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
        query = (frame.writeStream.foreachBatch(on_batch).option("checkpointLocation", storage.spark_path(checkpoint))
                 .trigger(processingTime=f"{max(1, int(interval_s * 1000))} milliseconds")
                 .queryName(f"versiq-ingest-{storage.basename(checkpoint)}").start())
        while not state["stop"] and query.isActive:
            time.sleep(0.2)
        # Let a running micro-batch finish its run; one that starts from now on refuses at once
        # (``stop`` is set). ``busy`` is not held across ``query.stop()``: that waits for the
        # stream's thread, which may be calling ``on_batch`` for a new batch, and ``on_batch``
        # waiting for ``busy`` would never return (a deadlock seen when a file was listed just
        # as SIGTERM came).
        with busy:
            pass
        try:
            query.stop()
        except Exception:  # noqa: BLE001 - the JVM may already be gone (signal to the group)
            log.warning("the file-stream query did not stop cleanly", exc_info=True)
            return int(state["status"])
        if state["fatal"] is not None:
            exc = state["fatal"]
            print(f"versiq ingest: error: {exc}", flush=True, file=sys.stderr)
            return EXIT_USAGE if isinstance(exc, UsageError) else EXIT_FAILED
        if not state["stop"]:
            error = query.exception()
            log.warning("the file-stream query stopped (%s); restarting in %.1fs", error, interval_s)
            deadline = time.monotonic() + interval_s
            while not state["stop"] and time.monotonic() < deadline:
                time.sleep(0.2)
    return int(state["status"])
