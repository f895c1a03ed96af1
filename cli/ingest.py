"""``versiq ingest`` and ``versiq driver``: ingest runs, in this process or a resident driver's."""

from __future__ import annotations

from typing import Any

from versiq.cli.options import Invocation, add_logging, add_warehouse


def _ingest(inv: Invocation) -> int:
    from versiq.ingest.commands import ingest_command
    from versiq.ingest.driver_client import autostart_hook, forward

    forwarded = forward(inv.argv, inv.args)  # a resident driver's run
    if forwarded is not None:
        return forwarded
    return ingest_command(inv.args, inv.parser, on_spark_start=autostart_hook(inv.args))


def _driver(inv: Invocation) -> int:
    from versiq.ingest.driver import driver_command

    return driver_command(inv.args, inv.parser.parse_args)


def add_ingest(sub: Any) -> None:
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
    add_warehouse(ing)
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
    ing.add_argument("--value-format", choices=("json", "string", "debezium", "avro", "json_sr", "protobuf"),
                     default=None,
                     help="Kafka: how record values are read: JSON text (default), a string, Debezium change "
                          "events (JSON converter), or the schema registry's wire format: Avro (avro) or "
                          "Protobuf (protobuf), each stored as the JSON of the decoded record, or JSON Schema "
                          "(json_sr); these three need --schema-registry")
    ing.add_argument("--key-format", choices=("string", "avro", "json_sr", "protobuf"), default=None,
                     help="Kafka: how record keys are read: the key bytes as UTF-8 text (string, default) or "
                          "the schema registry's wire format (avro, json_sr, protobuf; needs --schema-registry): "
                          "a decoded string is the key as it is, an integer its digits, a record its compact "
                          "JSON with members sorted by name. A key that cannot be decoded is rejected bad_key")
    ing.add_argument("--timestamp-field", metavar="PATH",
                     help="Kafka: take the timestamp from this field of the JSON value (dotted path; RFC 3339 "
                          "or epoch ms) instead of the Kafka record timestamp")
    ing.add_argument("--timestamp-header", metavar="NAME",
                     help="Kafka: take the timestamp from this record header (its UTF-8 text: epoch ms or RFC "
                          "3339; the last header of that name) instead of the Kafka record timestamp; a record "
                          "without it is rejected missing_field")
    ing.add_argument("--schema-registry", metavar="URL",
                     help="Kafka, --value-format or --key-format avro, json_sr or protobuf: the schema registry's "
                          "Confluent-compatible base URL (e.g. http://registry:8081, Apicurio's "
                          ".../apis/ccompat/v7); each value's (key's) writer schema is fetched by the id in its "
                          "5-byte header. A value that cannot be decoded is rejected bad_value (a key bad_key); "
                          "a registry that cannot be reached fails the run")
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
                          "watched with the kernel's file notifications and Kafka topics by a consumer, a "
                          "pipeline with an S3 source by a Spark Structured Streaming query; each time runs "
                          "the pipeline once")
    ing.add_argument("--trigger-interval", default="5s",
                     help="continuous mode: the least time between the starts of two runs that "
                          "committed something (default 5s)")
    ing.add_argument("--watch-interval", default=None,
                     help="continuous mode: how often sources that cannot notify are checked for new input, "
                          "at most --trigger-interval, less often when a listing is slow "
                          "(default 100ms: local folders where the kernel cannot "
                          "notify, Kafka topics read with Java-only client settings; S3 sources: "
                          "--trigger-interval, a check being a LIST request). Local folders are checked when "
                          "the kernel reports a change and every --trigger-interval, other Kafka topics when a "
                          "consumer receives a record")
    ing.add_argument("--lock-timeout", default="60s",
                     help="how long to wait for another writer of the same store (default 60s)")
    ing.add_argument("--progress", default="auto", metavar="auto|off|INTERVAL",
                     help="while a phase lasts, repeat it on stderr with its duration and Spark's task "
                          "progress: every 15s when stderr is a terminal (auto, the default), never (off), "
                          "or every INTERVAL (e.g. 5s)")
    add_logging(ing)
    ing.set_defaults(run=_ingest)


def add_driver(sub: Any) -> None:
    drv = sub.add_parser(
        "driver",
        help="keep a warm Spark session that runs 'versiq ingest' for the CLI (resident driver)",
        description="Start a Spark session once, warm it up with a few runs into a scratch warehouse, and run "
        "every batch 'versiq ingest' of this user in it: a run then skips the JVM's start and first compilation "
        "(docs/benchmarks.md has the figures). 'versiq ingest' uses the driver "
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
    add_logging(drv)
    drv.set_defaults(run=_driver)
