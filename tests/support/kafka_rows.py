"""Kafka records as Spark's Kafka source gives them to ``records.kafka_rows`` (one partition,
offsets 0, 1, ..., timestamps 1000, 1001, ..., no headers), parsed: for the tests of one value
or key format at a time."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from versiq.ingest.records.kafka_rows import KAFKA_INPUT_SCHEMA, KafkaFormat, parse_kafka
from versiq.ingest.records.schema import PARSED_SCHEMA


def parse(values: list[bytes | None], fmt: KafkaFormat, keys: list[bytes | None] | None = None) -> list[dict[str, Any]]:
    """The parsed rows of records with these values (and keys: default ``k0``, ``k1``, ...)."""
    n = len(values)
    batch = pa.RecordBatch.from_arrays([
        pa.array(keys if keys is not None else [f"k{i}".encode() for i in range(n)], pa.binary()),
        pa.array(values, pa.binary()), pa.array([0] * n, pa.int32()), pa.array(range(n), pa.int64()),
        pa.array([1_000 + i for i in range(n)], pa.int64()),
        pa.nulls(n, KAFKA_INPUT_SCHEMA.field("headers").type)], schema=KAFKA_INPUT_SCHEMA)
    parsed = parse_kafka(batch, fmt, "kafka:t")
    assert parsed.schema == PARSED_SCHEMA
    return parsed.to_pylist()
