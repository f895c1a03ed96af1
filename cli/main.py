"""The ``versiq`` command line: argument parsing only; each subcommand's work lives in its package.

The flags and exit codes here are a contract other tools drive (issues #3, #4; docs/contract.md):
add, never rename. Exit status: 0 success, 1 a store failed, 2 usage or configuration error.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Sequence

from versiq import __version__, settings, storage
from versiq.exits import EXIT_USAGE
from versiq.logs import setup_logging

#: Where every command's --warehouse help says a warehouse may live.
WAREHOUSE_HELP = ("warehouse: a directory, or s3://bucket/prefix (endpoint, region and credentials from the "
                  "standard AWS_* variables) (env VERSIQ_WAREHOUSE)")


def warehouse_location(text: str) -> str:
    """A --warehouse value in its canonical form (``versiq.storage.normalize``)."""
    try:
        return storage.normalize(text)
    except storage.StorageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_snapshot_options(parser: argparse.ArgumentParser) -> None:
    """Which snapshot answers: ``--snapshot`` or ``--as-of-system-time``."""
    parser.add_argument("--snapshot", type=int, default=None, help="answer from this Delta version of the store")
    parser.add_argument("--as-of-system-time", default=None, metavar="T",
                        help="answer from the snapshot current at T (epoch ms or RFC 3339; not with --snapshot)")


def _add_read_options(parser: argparse.ArgumentParser) -> None:
    """Which snapshot answers (``_add_snapshot_options``) and ``--iso``."""
    _add_snapshot_options(parser)
    parser.add_argument("--iso", action="store_true", help="print times as RFC 3339 (UTC) instead of epoch ms")


def _add_warehouse(parser: argparse.ArgumentParser, default: str | None = None) -> None:
    """--warehouse, defaulting to VERSIQ_WAREHOUSE (then ``default``); required when neither is set."""
    value = settings.WAREHOUSE.value() or default
    parser.add_argument("--warehouse", default=value, required=value is None, type=warehouse_location,
                        help=WAREHOUSE_HELP)



def _add_logging(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--log-format",
        choices=("text", "json"),
        default=settings.LOG_FORMAT.value(),
        help="log format on stderr: human-readable text (default) or one JSON object per line "
        "(for services; env VERSIQ_LOG_FORMAT)",
    )
    parser.add_argument(
        "--log-level",
        default=settings.LOG_LEVEL.value(),
        help="log level (DEBUG, INFO, WARNING, ERROR; env VERSIQ_LOG_LEVEL)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="versiq",
        description="Versioned state stores with Kafka Streams semantics: ingest changelogs "
        "into Delta Lake with Spark, query them over HTTP.",
    )
    parser.add_argument("--version", action="version", version=f"versiq {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    ing = sub.add_parser(
        "ingest",
        help="ingest changelog files or Kafka topics into versioned stores (PySpark job)",
        description="Ingest changelog files or Kafka topics into versioned (or timestamped) stores kept as "
        "Delta tables under the warehouse. Batch mode ingests every file not yet ingested "
        "(or a topic's records up to the end offsets seen when the run starts) and exits; --continuous "
        "keeps watching the sources. Either name one store with --store and --source (files) or "
        "--kafka-bootstrap/--topic, or give a YAML pipeline file with --config: stores, streams and derived "
        "tables (filter, joins, foreign-key joins, aggregations, stream-table joins; see "
        "docs/derived-tables.md), computed in the same run.",
        epilog="A batch run is made by a resident driver ('versiq driver') when one listens and can run it as "
        "this process would. With VERSIQ_DRIVER_AUTOSTART set to a duration (e.g. 30m), a run that starts "
        "Spark on a local master (no --master) and finds no driver starts one in the background, once it has "
        "ended, for the runs after it; that driver ends after the duration without a run, or when a run of "
        "other code asks ('versiq driver --status' / '--stop').",
    )
    _add_warehouse(ing)
    ing.add_argument("--store", help="store name: letters, digits, _ - . (with --source)")
    ing.add_argument("--source", help="changelog file or directory (read recursively)")
    ing.add_argument("--kafka-bootstrap", metavar="HOST:PORT",
                     help="Kafka bootstrap servers: read the store from --topic instead of files (client "
                          "settings such as SASL/SSL come from VERSIQ_KAFKA_<NAME> variables, e.g. "
                          "VERSIQ_KAFKA_SECURITY_PROTOCOL)")
    ing.add_argument("--topic", help="Kafka topic of the store (with --kafka-bootstrap)")
    ing.add_argument("--starting-offsets", choices=("earliest", "latest"), default=None,
                     help="Kafka: where a new store starts reading its topic (default earliest); later runs "
                          "go on from the offsets the store committed")
    ing.add_argument("--value-format", choices=("json", "string", "debezium"), default=None,
                     help="Kafka: how record values are read: JSON text (default), a string, or Debezium "
                          "change events (JSON converter)")
    ing.add_argument("--timestamp-field", metavar="PATH",
                     help="Kafka: take the timestamp from this field of the JSON value (dotted path; RFC 3339 "
                          "or epoch ms) instead of the Kafka record timestamp")
    ing.add_argument("--allow-offset-gaps", action="store_true",
                     help="Kafka: when records the store had not read were deleted by the topic's retention, "
                          "record the gap and read on instead of failing")
    ing.add_argument("--config",
                     help="YAML pipeline file with 'stores:' and optionally 'streams:' and 'tables:' (instead of "
                          "--store/--source)")
    ing.add_argument("--format", choices=("jsonl", "csv", "parquet"), default=None,
                     help="input format (default: from the file extension, else jsonl)")
    ing.add_argument("--kind", choices=("versioned", "timestamped"), default=None,
                     help="store kind when the store is created (default versioned)")
    ing.add_argument("--history-retention", default=None,
                     help="history retention = grace period: ms, 5m/12h/7d or ISO-8601 P7D "
                     "(default 1d; fixed when the store is created)")
    ing.add_argument("--max-future", default=None,
                     help="refuse records stamped later than the run's wall clock plus this, as "
                          "bad_timestamp, so a broken clock cannot pin stream time (default 1h; 'none' "
                          "for no limit; checked at every run, not fixed; with --config, the default of "
                          "the stores and streams that do not set max_future)")
    ing.add_argument("--partitions", type=int, default=None,
                     help="stream-time partitions (default 1; fixed when the store is created)")
    ing.add_argument("--buckets", type=int, default=None,
                     help="physical key-hash buckets for file pruning (default 16; layout only)")
    ing.add_argument("--master", default=None,
                     help="Spark master URL (default env SPARK_MASTER, else local[*])")
    ing.add_argument("--report", default=None, help="write the run report as JSON to this file")
    ing.add_argument("--continuous", action="store_true",
                     help="keep running and ingest new input as it lands: local files and folders are "
                          "watched with the kernel's file notifications, a pipeline with a Kafka topic or an "
                          "S3 source by a Spark Structured Streaming query; each time runs the pipeline once")
    ing.add_argument("--trigger-interval", default="5s",
                     help="continuous mode: the least time between the starts of two runs that "
                          "committed something (default 5s)")
    ing.add_argument("--watch-interval", default=None,
                     help="continuous mode: how often the sources are checked for new input, at most "
                          "--trigger-interval (default 100ms for local folders and Kafka topics, adapted to "
                          "what a check costs, e.g. for a folder of many files; S3 sources: "
                          "--trigger-interval, a check being a LIST request). A pipeline of local sources alone "
                          "is checked when the kernel reports a change and every --trigger-interval, and this "
                          "often only where the kernel cannot notify")
    ing.add_argument("--lock-timeout", default="60s",
                     help="how long to wait for another writer of the same store (default 60s)")
    ing.add_argument("--progress", default="auto", metavar="auto|off|INTERVAL",
                     help="while a phase lasts, repeat it on stderr with its duration and Spark's task "
                          "progress: every 15s when stderr is a terminal (auto, the default), never (off), "
                          "or every INTERVAL (e.g. 5s)")
    _add_logging(ing)

    drv = sub.add_parser(
        "driver",
        help="keep a warm Spark session that runs 'versiq ingest' for the CLI (resident driver)",
        description="Start a Spark session once, warm it up with a few runs into a scratch warehouse, and run "
        "every batch 'versiq ingest' of this user in it: a run then skips the JVM's start and first compilation "
        "(10k events into a store of 2M versions: about 5 s instead of 15.5 s). 'versiq ingest' uses the driver "
        "listening on the socket (as the same user) when its code, umask, master and environment (VERSIQ_*, "
        "AWS_*, SPARK_*, PYSPARK_*, HADOOP_*, JAVA_*, TZ, TMPDIR, HOME) are the driver's and the driver is not "
        "busy with another run, and runs in its own process otherwise; a run is atomic either way. Ends after "
        "--idle-timeout without a run, or on SIGTERM/SIGINT after the run in progress. With "
        "VERSIQ_DRIVER_AUTOSTART set (a duration), 'versiq ingest' starts one by itself when a run needs Spark "
        "and none listens.",
    )
    drv.add_argument("--socket", default=None,
                     help="Unix socket to listen on (default env VERSIQ_DRIVER_SOCKET, else "
                          "$XDG_RUNTIME_DIR/versiq/driver.sock or ~/.cache/versiq/driver.sock; "
                          "VERSIQ_DRIVER_SOCKET=off makes 'versiq ingest' never use a driver)")
    drv.add_argument("--idle-timeout", default="30m",
                     help="stop after this long without a run (default 30m)")
    drv.add_argument("--master", default=None, help="Spark master URL (default env SPARK_MASTER, else local[*])")
    drv.add_argument("--no-warm-up", action="store_true",
                     help="serve at once, without the warm-up runs (the first runs are then slower)")
    what = drv.add_mutually_exclusive_group()
    what.add_argument("--status", action="store_true",
                      help="print the pid of the driver on the socket (serving or starting) and exit; exit 1 if none")
    what.add_argument("--stop", action="store_true",
                      help="stop the driver on the socket (after its run in progress) and wait until it has ended; "
                           "exit 1 if none, or if the pid its lock file names does not serve the socket as this user")
    drv.add_argument("--after-pid", type=int, default=None, metavar="PID",
                     help="claim the socket now, start Spark once process PID has ended, and end at the first "
                          "request of other code (what a run with VERSIQ_DRIVER_AUTOSTART asks of the driver it "
                          "starts)")
    _add_logging(drv)

    srv = sub.add_parser(
        "serve",
        help="serve the HTTP query API",
        description="Serve VersionedKeyQuery / MultiVersionedKeyQuery over HTTP for every store "
        "of the warehouse. Every option also reads an environment variable.",
        epilog="A request head must arrive within VERSIQ_REQUEST_HEAD_TIMEOUT (default 10s) and its body "
        "within VERSIQ_REQUEST_BODY_TIMEOUT (default 60s) after it; request "
        "targets over 64 KiB are refused 414 and headers over 64 KiB 431. Exit status: 0 stopped, "
        "2 usage or configuration error, 3 could not start serving (e.g. the address is in use).",
    )
    srv.add_argument("--warehouse", default=settings.WAREHOUSE.value(), type=warehouse_location,
                     help=WAREHOUSE_HELP)
    srv.add_argument("--host", default=settings.HOST.value(),
                     help="bind address (env VERSIQ_HOST, default 127.0.0.1)")
    srv.add_argument("--port", type=int, default=settings.PORT.value(),
                     help="port (env VERSIQ_PORT, default 8080)")
    srv.add_argument("--workers", type=int, default=settings.WORKERS.value(),
                     help="worker processes (env VERSIQ_WORKERS, default 1)")
    _add_logging(srv)

    mnt = sub.add_parser(
        "maintain",
        help="compact and vacuum a store",
        description="Compact each bucket of a store to one row per version and drop history that "
        "ended at or before the retention horizon (no query can return it: expired versions are "
        "deleted from the current snapshot for good), and vacuum files no snapshot still needs "
        "(keeping every snapshot younger "
        "than the page-token lifetime, 1 hour) and files no commit ever referenced once older "
        "than that hour (left by a killed ingest or maintain, or a failed write), in the store and "
        "its _rejected, _changelog and _emitted tables (VERSIQ_VACUUM_RETENTION_HOURS sets the "
        "hour). A file a writer may still commit is never removed: every writer holds the store's "
        "writer lock from its first file to its last commit and maintain holds it too, and files "
        "younger than the retention are kept whatever wrote them. Writes go through Delta's Spark "
        "connector, which also writes a checkpoint every 50 commits; a store with nothing to "
        "compact or vacuum starts no Spark.",
    )
    _add_warehouse(mnt)
    mnt.add_argument("--store", required=True, help="store name")
    mnt.add_argument("--lock-timeout", default="60s", help="wait this long for another writer")
    _add_logging(mnt)

    drop = sub.add_parser(
        "drop",
        help="drop a store, stream or derived table from the warehouse (CLI only)",
        description="Remove a store (--store) or a derived table or stream (--table) from the warehouse: its Delta "
        "log first, so the service never reads it half deleted, then all its files, under its writer lock. "
        "Refused while derived tables read it (their inputs, recorded by every derived commit, say so), unless "
        "--cascade drops them too, each before the tables it reads. A drop that was interrupted is completed by "
        "running it again. The service lists the table as gone at its next refresh and frees its serving index. "
        "Exit 2 for an unknown name or a table that others read, 1 when a writer lock was not obtained.",
    )
    _add_warehouse(drop)
    which = drop.add_mutually_exclusive_group(required=True)
    which.add_argument("--store", help="the store to drop (a source store, or a derived table kept as a store)")
    which.add_argument("--table", help="the derived table or stream to drop")
    drop.add_argument("--cascade", action="store_true", help="also drop every derived table that reads it")
    drop.add_argument("--lock-timeout", default="60s", help="wait this long for each table's writer")
    _add_logging(drop)

    reb = sub.add_parser(
        "rebuild",
        help="recompute a derived table from its inputs' current history (CLI only)",
        description="Drop a derived table of the pipeline file (its data, side tables and state) and compute it "
        "again from what its inputs hold now, as a table new to the warehouse starts (docs/derived-tables.md, "
        "'Tables added over an existing store'). Nothing is ingested; a derived table it reads that is behind "
        "its sources is brought up to date in the same run. Refused while other derived tables read it, "
        "unless --cascade rebuilds them too. Exit 2 for a usage error, 1 when the table failed (see the log).",
    )
    _add_warehouse(reb)
    reb.add_argument("--config", required=True, help="the YAML pipeline file that defines the table")
    reb.add_argument("--table", required=True, help="the derived table to rebuild")
    reb.add_argument("--cascade", action="store_true", help="also rebuild every derived table that reads it")
    reb.add_argument("--master", default=None, help="Spark master URL (default env SPARK_MASTER, else local[*])")
    reb.add_argument("--lock-timeout", default="60s", help="wait this long for each table's writer")
    _add_logging(reb)

    era = sub.add_parser(
        "erase",
        help="erase keys from a store and its derived tables, for good",
        description="Remove every row of the given keys from a store, its _changelog and _rejected "
        "(rejected records whose raw text contains a key too) and the derived tables keyed by its key "
        "(filters, copies, primary-key joins, stream outputs), one Delta commit per table, then delete the "
        "files that held them at once, whatever the vacuum retention: older snapshots that read those files "
        "answer 410 gone. Records the erase (time, user, number of keys, a keyed hash of each) in the store's "
        "_erasures table. Tables that aggregate or join through another key are named, to recompute with "
        "versiq rebuild. Running it again completes an erase that was interrupted. No key or value is "
        "printed or logged.",
    )
    _add_warehouse(era)
    era.add_argument("--store", required=True, help="store name")
    era.add_argument("--key", action="append", default=[], help="a key to erase (repeat for several)")
    era.add_argument("--keys-file", metavar="FILE", help="a file of keys to erase, one per line (UTF-8)")
    era.add_argument("--lock-timeout", default="60s", help="wait this long for another writer")
    _add_logging(era)

    rej = sub.add_parser(
        "rejected",
        help="list rejected input records of a store",
        description="Print the rejected records of a store, one JSON object per line, ordered "
        "by (run, source, line/row).",
    )
    _add_warehouse(rej)
    rej.add_argument("--store", required=True, help="store name")
    rej.add_argument("--reason", default=None, help="only this reason code (e.g. late, malformed)")
    rej.add_argument("--format", choices=("jsonl", "table"), default="jsonl",
                     help="jsonl (default, for scripts) or a human-readable table")
    _add_logging(rej)

    keys = sub.add_parser(
        "keys",
        help="list the keys of a store with their records (no server needed)",
        description="Print the keys of a store in UTF-8 byte order, one JSON object per line, each "
        "with the record a read of the same snapshot answers (latest, or as of --as-of): the "
        "records of GET /v1/stores/{store}/keys, every page, from one snapshot. Keys without a "
        "value are left out; --include-deleted lists a key deleted by a tombstone as "
        '{"key", "timestamp", "validTo", "deleted": true}. Exit 2 for an unknown store or a bad option.',
    )
    _add_warehouse(keys)
    keys.add_argument("--store", required=True, help="store name")
    keys.add_argument("--prefix", default=None, help="only keys that start with this")
    keys.add_argument("--start", default=None, help="lowest key (inclusive)")
    keys.add_argument("--end", default=None, help="keys below this one (exclusive)")
    keys.add_argument("--as-of", default=None,
                      help="answer as of this time: epoch ms or RFC 3339 (default: latest)")
    keys.add_argument("--include-deleted", action="store_true", help="also list keys deleted by a tombstone")
    _add_read_options(keys)
    _add_logging(keys)

    get = sub.add_parser(
        "get",
        help="the record of one key, latest or as of a time (no server needed)",
        description="Print the answer of GET /v1/stores/{store}/keys/{key} as one JSON object: the record "
        '{"key", "value", "timestamp", "validTo", "snapshot"}, or, when the key has no value then, the '
        "problem object of the 404 (not-found, with deletedAt for a tombstone; or expired). Exit 0 with a "
        "record, 4 without a value, 2 for an unknown store or a bad option.",
    )
    _add_warehouse(get)
    get.add_argument("--store", required=True, help="store name")
    get.add_argument("--key", required=True, help="the key (any UTF-8 text)")
    get.add_argument("--as-of", default=None, help="answer as of this time: epoch ms or RFC 3339 (default: latest)")
    _add_read_options(get)
    _add_logging(get)

    look = sub.add_parser(
        "lookup",
        help="point-in-time lookups of many (key, asOf) pairs from a table (no server needed)",
        description="Answer every (key, asOf) pair of --input (Parquet or Arrow IPC: a string column 'key' and "
        "an optional 'asOf' of epoch ms or timestamps, null = latest; at most 100,000 pairs) from one snapshot, "
        "each exactly as GET /v1/stores/{store}/keys/{key}?asOf= answers it, and write the answers in input "
        "order to --output by its extension: .parquet or .arrow (columns key, as_of, outcome ok/not-found/"
        "expired, value as JSON text, timestamp, valid_to, deleted_at; the snapshot in the schema metadata "
        "'versiq.snapshot') or .jsonl (the result objects of POST /v1/stores/{store}/lookups). Exit 2 for an "
        "unknown store or an unreadable input.",
    )
    _add_warehouse(look)
    look.add_argument("--store", required=True, help="store name")
    look.add_argument("--input", required=True, help="the pairs: a .parquet file or an Arrow IPC file")
    look.add_argument("--output", required=True, help="where the answers go: .parquet, .arrow or .jsonl")
    _add_snapshot_options(look)
    _add_logging(look)

    sql = sub.add_parser(
        "sql",
        help="a read-only SQL session over the warehouse (DuckDB; no server needed)",
        description="Open a read-only DuckDB session in which every store is a view of its resolved versions "
        "(key, value, valid_from, valid_to, deleted: the read rule applied, expired history left out) and every "
        "stream a view of its records (key, value, timestamp, run, seq), from the current snapshots (or those "
        "--snapshot-of names). With -c, run one query and print it; without, read statements ending in ';' "
        "from standard input. Nothing outside the views can be read and no file written. Exit 2 for an SQL "
        "error or a bad option.",
    )
    _add_warehouse(sql)
    sql.add_argument("--snapshot-of", action="append", default=[], metavar="STORE=V",
                     help="read STORE (or a stream) at Delta version V (repeatable)")
    sql.add_argument("-c", "--command", dest="query", default=None, help="the query to run")
    sql.add_argument("--format", choices=("table", "csv", "json"), default="table",
                     help="table (default, for people), csv, or json (one object per line)")
    _add_logging(sql)

    hist = sub.add_parser(
        "history",
        help="the commits (snapshots) of a store, newest first (no server needed)",
        description="Print the commits of GET /v1/stores/{store}/history, one JSON object per line, newest "
        'first: {"snapshot", "committedAt", "operation" (ingest, derive, settings, maintain), "run", '
        '"counts", "files"(, "kafka")}. Exit 2 for an unknown store.',
    )
    _add_warehouse(hist)
    hist.add_argument("--store", required=True, help="store name")
    hist.add_argument("--iso", action="store_true", help="print times as RFC 3339 (UTC) instead of epoch ms")
    _add_logging(hist)

    demo = sub.add_parser(
        "demo",
        help="generate sample data, ingest it and serve it",
        description="Generate a realistic sample changelog (product prices), ingest it into the "
        "warehouse and serve it on 127.0.0.1:8080, printing example curl queries.",
    )
    demo.add_argument("--warehouse", default="warehouse", help="warehouse directory (default ./warehouse)")
    demo.add_argument("--data", default="demo-data", help="where to write the sample changelog")
    demo.add_argument("--keys", type=int, default=5000, help="number of product keys (default 5000)")
    demo.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    demo.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    demo.add_argument("--no-serve", action="store_true", help="generate and ingest, then exit")
    _add_logging(demo)

    gen = sub.add_parser(
        "generate",
        help="write a sample changelog (product prices) to a directory",
        description="Write a deterministic sample changelog with out-of-order records, late "
        "records past grace, tombstones and a few malformed lines.",
    )
    gen.add_argument("--out", required=True, help="output directory")
    gen.add_argument("--keys", type=int, default=5000, help="number of keys (default 5000)")
    gen.add_argument("--versions", type=int, default=10, help="versions per key (default 10)")
    gen.add_argument("--files", type=int, default=4, help="number of files (default 4)")
    gen.add_argument("--format", choices=("jsonl", "csv", "parquet"), default="jsonl")
    gen.add_argument("--seed", type=int, default=7, help="random seed (default 7)")
    _add_logging(gen)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        parser = build_parser()  # option defaults come from VERSIQ_* variables
    except settings.SettingError as exc:
        print(f"versiq: {exc}", file=sys.stderr)
        return EXIT_USAGE
    args = parser.parse_args(argv)
    setup_logging(args.log_format, args.log_level)
    settings.warn_unknown()
    if args.command == "ingest":
        from versiq.ingest.commands import ingest_command
        from versiq.ingest.driver_client import autostart_hook, forward

        forwarded = forward(list(sys.argv[1:] if argv is None else argv), args)  # a resident driver's run
        if forwarded is not None:
            return forwarded
        return ingest_command(args, parser, on_spark_start=autostart_hook(args))
    if args.command == "driver":
        from versiq.ingest.driver import driver_command

        return driver_command(args, parser.parse_args)
    if args.command == "serve":
        from versiq.service.commands import serve_command

        return serve_command(args, parser)
    if args.command == "maintain":
        from versiq.ingest.commands import maintain_command

        return maintain_command(args)
    if args.command in ("drop", "rebuild"):
        from versiq.ingest.commands import drop_command, rebuild_command

        return drop_command(args) if args.command == "drop" else rebuild_command(args)
    if args.command == "erase":
        from versiq.ingest.commands import erase_command

        return erase_command(args)
    if args.command == "rejected":
        from versiq.ingest.commands import rejected_command

        return rejected_command(args)
    if args.command == "sql":
        from versiq.service.offline import sql_command

        return sql_command(args)
    if args.command in ("keys", "get", "history", "lookup"):
        from versiq.service import offline

        command: Callable[[argparse.Namespace], int] = {
            "keys": offline.keys_command, "get": offline.get_command, "history": offline.history_command,
            "lookup": offline.lookup_command,
        }[args.command]
        return command(args)
    if args.command == "demo":
        from versiq.cli.demo import demo_command

        return demo_command(args, main)  # the demo drives the CLI itself: passed down, never imported back
    if args.command == "generate":
        from versiq.cli.sample import generate_command

        return generate_command(args)
    parser.error(f"unknown command {args.command}")
    return EXIT_USAGE


def run() -> None:  # pragma: no cover - the process entry point
    """``versiq`` as a process: run ``main``, flush everything, then end the process without
    interpreter teardown. Native thread pools (delta-rs' runtime, Arrow's, DuckDB's) can abort
    while the interpreter tears down ("terminate called without an active exception", exit
    -6) after all work and output are done; seen once under heavy load with ``versiq
    rejected``. The exit status must be the command's, so teardown is skipped."""
    import logging

    code = main()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        _stop_parse_workers()
        logging.shutdown()
        os._exit(code)


def _stop_parse_workers() -> None:
    """The worker processes of a large run parsed here (``ingest.parse_workers``), if this
    process started any: they would end with it anyway, but their semaphores would be reported
    as leaked. Looked up, not imported: most commands never load the ingest."""
    workers = sys.modules.get("versiq.ingest.parse_workers")
    if workers is not None:
        with contextlib.suppress(BaseException):  # a second Ctrl-C: the process ends all the same
            workers.stop_pool()


if __name__ == "__main__":  # pragma: no cover
    run()
