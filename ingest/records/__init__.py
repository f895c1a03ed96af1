"""Parsing changelog files into records or rejections (in Spark tasks, or in the run's own
process for a small run: ``ingest.parse``).

One function per format turns a file into Arrow batches of ``PARSED_SCHEMA``: every non-blank
line/row becomes exactly one row, either a record (``reason`` null) or a rejection with its
reason code, a precise ``detail`` and the exact original text. Nothing is dropped here, so the
run report's ``read`` is simply the row count.

- ``schema``: the parsed-record schema and the size limits;
- ``jsonvalue``: the strict JSON codec of values (and their stored compact text);
- ``fields``: the field rules of every format (keys, timestamps, partitions, offsets, values);
- ``batch``: collecting records and rejections (rules that hold for every format are checked
  there once);
- ``jsonl``, ``csv_rows``, ``parquet_rows``: one module per format, each with its fast path and
  its general path;
- ``files``: one file whatever its format (the entry point), the ``max_future`` guard, and
  re-reading the text of records rejected after parsing.
"""

from versiq.ingest.records.csv_rows import parse_csv
from versiq.ingest.records.fields import Reject, key_from_json, timestamp_from_json, value_from_json_text
from versiq.ingest.records.files import (
    PARSERS,
    format_of,
    parse_bytes_for_tests,
    parse_file,
    raw_texts,
    refuse_future,
)
from versiq.ingest.records.jsonl import parse_jsonl
from versiq.ingest.records.jsonvalue import compact, strict_loads
from versiq.ingest.records.kafka_rows import KafkaFormat, parse_kafka
from versiq.ingest.records.parquet_rows import parse_parquet
from versiq.ingest.records.schema import BATCH_ROWS, FORMAT_BY_EXTENSION, MAX_RECORD_BYTES, PARSED_SCHEMA

__all__ = [
    "BATCH_ROWS", "FORMAT_BY_EXTENSION", "MAX_RECORD_BYTES", "PARSED_SCHEMA", "PARSERS", "KafkaFormat", "Reject",
    "compact", "format_of", "key_from_json", "parse_bytes_for_tests", "parse_csv", "parse_file", "parse_jsonl",
    "parse_kafka", "parse_parquet", "raw_texts", "refuse_future", "strict_loads", "timestamp_from_json",
    "value_from_json_text",
]
