"""CLI glue for ``versiq ingest``, ``versiq rejected``, ``versiq maintain`` and ``versiq erase``.

Exit status (docs/contract.md): 0 every store committed; 1 a store failed (its report entry has
``error``); 2 usage/configuration error found before any data is touched.

Continuous mode (``ingest.watch``): the kernel's file notifications, a consumer per Kafka topic,
or a poll of what cannot notify (S3 sources, topics only the Java client reads) say when the
sources hold something new, and each time the pipeline runs once; the files done (or topic
positions) committed with each store's data stay the source of truth for what was ingested.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
from collections.abc import Callable
from typing import Any

from versiq import layout
from versiq.durations import DurationError, parse_duration_ms
from versiq.exits import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from versiq.ingest.errors import WRITER_FAILURES, LeaseLost, UsageError, storage_error_in
from versiq.ingest.progress import Heartbeat, interval_from
from versiq.ingest.store import LockTimeout
from versiq.logs import counted

log = logging.getLogger("versiq.ingest")



def _pipeline_from_args(args: argparse.Namespace) -> Any:
    from versiq.ingest.config import Pipeline, load_config
    from versiq.ingest.future import DEFAULT_MAX_FUTURE_MS, parse_max_future
    from versiq.ingest.kafka import KafkaSource
    from versiq.ingest.pipeline import StoreSpec
    from versiq.ingest.records.kafka_rows import KafkaFormat

    max_future: int | None = DEFAULT_MAX_FUTURE_MS
    if args.max_future is not None:
        try:
            max_future = parse_max_future(args.max_future)
        except DurationError as exc:
            raise UsageError(f"--max-future: {exc} (or none)") from None
    kafka_flags = [flag for flag, value in (("--kafka-bootstrap", args.kafka_bootstrap), ("--topic", args.topic),
                                            ("--starting-offsets", args.starting_offsets),
                                            ("--value-format", args.value_format),
                                            ("--key-format", args.key_format),
                                            ("--timestamp-field", args.timestamp_field),
                                            ("--timestamp-header", args.timestamp_header),
                                            ("--schema-registry", args.schema_registry),
                                            ("--allow-offset-gaps", args.allow_offset_gaps)) if value]
    if args.config:
        if args.store or args.source or kafka_flags:
            raise UsageError("give either --config or --store with --source (or --kafka-bootstrap/--topic), "
                             f"not both{' (' + ', '.join(kafka_flags) + ')' if kafka_flags else ''}")
        # --max-future is the default of the file's stores and streams that do not set max_future
        return load_config(args.config, args.warehouse, default_max_future_ms=max_future)
    kafka = None
    if kafka_flags:
        if args.source:
            raise UsageError("give either --source (files) or --kafka-bootstrap/--topic, not both")
        if not args.kafka_bootstrap or not args.topic:
            raise UsageError("a Kafka source needs both --kafka-bootstrap and --topic")
        kafka = KafkaSource(bootstrap=args.kafka_bootstrap, topic=args.topic,
                            starting_offsets=args.starting_offsets or "earliest",
                            allow_offset_gaps=args.allow_offset_gaps,
                            format=KafkaFormat(value_format=args.value_format or "json",
                                               timestamp_field=args.timestamp_field,
                                               timestamp_header=args.timestamp_header,
                                               schema_registry=args.schema_registry,
                                               key_format=args.key_format or "string"))
    if not args.store or not (args.source or kafka):
        raise UsageError("--store and --source (or --kafka-bootstrap and --topic) are required (or --config FILE)")
    retention = None
    if args.history_retention is not None:
        try:
            retention = parse_duration_ms(args.history_retention)
        except DurationError as exc:
            raise UsageError(f"--history-retention: {exc}") from None
    return Pipeline(stores=[StoreSpec(name=args.store, source=kafka.name if kafka else args.source, format=args.format,
                                      kind=args.kind, history_retention_ms=retention, partitions=args.partitions,
                                      buckets=args.buckets, max_future_ms=max_future, kafka=kafka)])


def _seconds(text: str, flag: str) -> float:
    try:
        return parse_duration_ms(text) / 1000.0
    except DurationError as exc:
        raise UsageError(f"{flag}: {exc}") from None


def write_report(path: str, report: dict[str, Any]) -> None:
    """Write the JSON report atomically (temp file + rename in the same directory)."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".report-", dir=folder)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(report, handle, indent=2, sort_keys=True)
        handle.write("\n")
    os.replace(tmp, path)


def print_summary(report: dict[str, Any]) -> None:
    for name, entry in report.get("streams", {}).items():
        if "error" in entry:
            print(f"stream {name}: FAILED: {entry['error']}", file=sys.stderr)
            continue
        rejected = {k: v for k, v in entry["rejected"].items() if v}
        print(f"stream {name}: read {entry['read']}, appended {entry['appended']}, rejected "
              f"{sum(rejected.values())} {json.dumps(rejected) if rejected else ''}"
              f"-> snapshot {entry['snapshot']} in {entry['seconds']:.1f}s", file=sys.stderr)
    for name, entry in report.get("tables", {}).items():
        if "error" in entry:
            print(f"table {name}: FAILED: {entry['error']}", file=sys.stderr)
            continue
        print(f"table {name} ({entry['kind']}): emitted {entry['emitted']}, accepted {entry['accepted_latest']} "
              f"latest + {entry['accepted_out_of_order']} out-of-order, late {entry['rejected']['late']} "
              f"-> snapshot {entry['snapshot']} (inputs {json.dumps(entry['inputs'])}) in {entry['seconds']:.1f}s",
              file=sys.stderr)
    for name, entry in report["stores"].items():
        if "error" in entry:
            print(f"store {name}: FAILED: {entry['error']}", file=sys.stderr)
            continue
        rejected = {k: v for k, v in entry["rejected"].items() if v}
        print(
            f"store {name}: read {entry['read']}, accepted {entry['accepted_latest']} latest + "
            f"{entry['accepted_out_of_order']} out-of-order ({counted(entry['tombstones'], 'tombstone')}, "
            f"{counted(entry['replaced_same_timestamp'], 'same-timestamp replacement')}), rejected "
            f"{sum(rejected.values())}{' ' + json.dumps(rejected) if rejected else ''} "
            f"-> snapshot {entry['snapshot']} in {entry['seconds']:.1f}s",
            file=sys.stderr,
        )


def ingest_command(args: argparse.Namespace, parser: argparse.ArgumentParser | None = None,
                   spark: Any = None, on_spark_start: Callable[[], object] | None = None) -> int:
    """``versiq ingest``. ``spark``: a running session to use (the resident driver's,
    ``ingest.driver``; batch mode only), else a run starts its own when it has data to read,
    calling ``on_spark_start`` first (``driver_client.autostart_hook``)."""
    try:
        pipeline = _pipeline_from_args(args)
        for spec in [*pipeline.stores, *pipeline.streams]:
            spec.validate()
        lock_timeout = _seconds(args.lock_timeout, "--lock-timeout")
        interval = _seconds(args.trigger_interval, "--trigger-interval")
        watch = None if args.watch_interval is None else _seconds(args.watch_interval, "--watch-interval")
        heartbeat = interval_from(getattr(args, "progress", "off"))
    except (UsageError, ValueError) as exc:
        print(f"versiq ingest: error: {exc}", file=sys.stderr)
        return EXIT_USAGE

    from versiq.ingest.run import run_pipeline
    from versiq.ingest.spark import SparkOnDemand

    if spark is not None and not args.continuous:
        return _one_run(spark, args, pipeline, lock_timeout)
    if not args.continuous:
        # The JVM starts only when the run has data to read (nothing new, a refused setting: none).
        on_demand = SparkOnDemand(args.master, on_start=on_spark_start)
        try:
            with Heartbeat(heartbeat, on_demand.running):
                return _one_run(on_demand.as_session(), args, pipeline, lock_timeout)
        finally:
            on_demand.stop()  # the demo serves in the same process afterwards: free the JVM
    from versiq.ingest.pipeline import open_for
    from versiq.ingest.spark import get_spark
    from versiq.ingest.streams import open_stream

    try:  # a store or stream that refuses its settings is refused before the JVM starts, as in a single run
        for store in pipeline.stores:
            open_for(args.warehouse, store)
        for stream in pipeline.streams:
            open_stream(args.warehouse, stream)
    except UsageError as exc:
        print(f"versiq ingest: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:  # noqa: BLE001 - the environment (e.g. a bucket that cannot be reached):
        # the runs report it per store and retry, as they always have
        log.warning("could not check the stores and streams before starting (%s: %s); each run checks them again",
                    type(exc).__name__, exc)
    spark = get_spark(args.master)  # continuous mode: one session for its whole life
    from versiq.ingest.delta import StateAhead, run_txn_needed
    from versiq.ingest.maintain import Compactor
    from versiq.ingest.watch import run_continuous

    state_ahead = StateAhead(spark)
    compactor = Compactor(spark, args.warehouse, lock_timeout, _log_failure)

    def one_run() -> Any:
        with Heartbeat(heartbeat, lambda: spark):
            return run_pipeline(spark, args.warehouse, pipeline, lock_timeout_s=lock_timeout)

    def after_run(report: Any) -> None:
        data = report.to_json()
        committed = report.committed
        if committed or report.failed:
            print_summary(data)
            if args.report:
                write_report(args.report, data)
        compactor.request([s.name for s in pipeline.stores] + [t.name for t in pipeline.tables if not t.is_stream])
        # what the next run's commits need from Delta, computed while nothing waits for it
        # (tables whose runs commit with a transaction id)
        state_ahead.start([path for path in (layout.table_path(args.warehouse, name) for name in committed)
                           if run_txn_needed(path)])

    try:
        return run_continuous(spark, args.warehouse, pipeline, interval, one_run, after_run, watch)
    finally:
        try:
            compactor.close()
            state_ahead.wait()
            spark.stop()
        except Exception:  # noqa: BLE001 - the JVM may have been signalled with us
            log.debug("spark.stop() failed", exc_info=True)


def _log_failure(what: str, exc: Exception) -> None:
    """Log ``what`` failed: in one line for a failure of the environment or of the writer lock
    (``pipeline.EXPLAINED_FAILURES``, S3), with the traceback for anything else (a defect)."""
    from versiq.ingest.pipeline import EXPLAINED_FAILURES

    explained = exc if isinstance(exc, EXPLAINED_FAILURES) else storage_error_in(exc)
    if explained is not None:
        log.error("%s: %s", what, explained)
    else:
        log.exception("%s", what)


def _one_run(spark: Any, args: argparse.Namespace, pipeline: Any, lock_timeout: float) -> int:
    from versiq.ingest.run import run_pipeline

    try:
        report = run_pipeline(spark, args.warehouse, pipeline, lock_timeout_s=lock_timeout)
    except UsageError as exc:
        print(f"versiq ingest: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    data = report.to_json()
    print_summary(data)
    if args.report:
        write_report(args.report, data)
    return EXIT_FAILED if report.failed else EXIT_OK


def rejected_command(args: argparse.Namespace) -> int:
    from versiq.ingest.rejected import iter_rejected

    try:
        rows = iter_rejected(args.warehouse, args.store, args.reason)
        if args.format == "table":
            for row in rows:
                where = (f"line {row['line']}" if "line" in row else f"row {row['row']}" if "row" in row
                         else f"partition {row.get('partition')} offset {row.get('offset')}")
                print(f"run {row['run']:>4}  {row['ingested_at']}  {row['reason']:<18} {row['source']}:{where}  "
                      f"{row['detail']}")
                print(f"      {row['raw']}")
        else:
            for row in rows:
                print(json.dumps(row, ensure_ascii=False))
    except UsageError as exc:
        print(f"versiq rejected: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        return EXIT_OK
    return EXIT_OK


def _administer(command: str, work: Callable[[], int],
                failures: tuple[type[Exception], ...] = WRITER_FAILURES, spark_storage: bool = True) -> int:
    """``work()``'s exit status, its errors as ``versiq COMMAND`` reports them in one line: a
    ``UsageError`` exit 2, ``failures`` exit 1, and (``spark_storage``) an S3 failure found in
    a Spark or Delta call's error (``errors.storage_error_in``) exit 1; anything else is a bug
    and raised."""
    try:
        return work()
    except UsageError as exc:
        print(f"versiq {command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except failures as exc:
        print(f"versiq {command}: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except Exception as exc:
        failure = storage_error_in(exc) if spark_storage else None
        if failure is None:
            raise
        print(f"versiq {command}: error: {failure}", file=sys.stderr)
        return EXIT_FAILED


def maintain_command(args: argparse.Namespace) -> int:
    from versiq.ingest.maintain import maintain_store

    def work() -> int:
        result = maintain_store(args.warehouse, args.store, _seconds(args.lock_timeout, "--lock-timeout"))
        print(json.dumps(result), file=sys.stderr)
        return EXIT_OK

    return _administer("maintain", work)


def drop_command(args: argparse.Namespace) -> int:
    """``versiq drop``: exit 0 dropped (the tables dropped printed as JSON on stderr), 2 usage
    (unknown name, read by derived tables without --cascade), 1 a writer lock not obtained or
    the storage failed."""
    from versiq.ingest.lifecycle import drop

    name, table = (args.table, True) if args.table is not None else (args.store, False)

    def work() -> int:
        result = drop(args.warehouse, name, table=table, cascade=args.cascade,
                      lock_timeout_s=_seconds(args.lock_timeout, "--lock-timeout"))
        print(json.dumps(result.to_json()), file=sys.stderr)
        return EXIT_OK

    return _administer("drop", work, (LockTimeout, LeaseLost, OSError), spark_storage=False)


def rebuild_command(args: argparse.Namespace) -> int:
    """``versiq rebuild``: exit 0 every table rebuilt (the drop and the tables' reports printed
    as JSON on stderr), 2 usage, 1 a table failed (its report has ``error``) or a lock was not
    obtained."""
    from versiq.ingest.config import load_config
    from versiq.ingest.lifecycle import rebuild
    from versiq.ingest.spark import get_spark

    def work() -> int:
        lock_timeout_s = _seconds(args.lock_timeout, "--lock-timeout")
        pipeline = load_config(args.config, args.warehouse)
        dropped, reports = rebuild(lambda: get_spark(args.master, short_lived=True), args.warehouse, pipeline,
                                   args.table, cascade=args.cascade, lock_timeout_s=lock_timeout_s)
        tables = {name: report.to_json() for name, report in reports.items()}
        print(json.dumps({**dropped.to_json(), "tables": tables}), file=sys.stderr)
        return EXIT_FAILED if any(report.error for report in reports.values()) else EXIT_OK

    return _administer("rebuild", work, (LockTimeout, LeaseLost, OSError), spark_storage=False)


def read_keys(args: argparse.Namespace) -> list[str]:
    """The keys of ``--key`` and ``--keys-file`` (one key per line, UTF-8; blank lines skipped,
    the line end is not part of the key)."""
    keys = list(args.key or [])
    if args.keys_file:
        try:
            with open(args.keys_file, encoding="utf-8", newline="") as handle:
                keys += [line.rstrip("\r\n") for line in handle if line.strip()]
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"--keys-file: {exc}") from None
    return keys


def erase_command(args: argparse.Namespace) -> int:
    from versiq.ingest.erase import erase_keys

    def work() -> int:
        result = erase_keys(args.warehouse, args.store, read_keys(args),
                            _seconds(args.lock_timeout, "--lock-timeout"))
        print(json.dumps(result.to_dict()))
        for table in result.rebuild:
            print(f"versiq erase: table {table!r} aggregates or joins through another key and still reflects the "
                  f"erased keys: run `versiq rebuild --table {table}`", file=sys.stderr)
        return EXIT_OK

    return _administer("erase", work)
