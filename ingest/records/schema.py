"""What a parser produces: the Arrow schema of parsed records and rejections, and the size limits."""

from __future__ import annotations

import pyarrow as pa

MAX_RECORD_BYTES = 1024 * 1024
BATCH_ROWS = 8192

PARSED_SCHEMA = pa.schema(
    [
        pa.field("source", pa.string()),
        pa.field("pos", pa.int64()),
        pa.field("key", pa.string()),
        pa.field("value", pa.string()),
        pa.field("ts", pa.int64()),
        pa.field("part", pa.int64()),
        pa.field("offset", pa.int64()),
        pa.field("reason", pa.string()),
        pa.field("detail", pa.string()),
        pa.field("raw", pa.string()),
    ]
)

FORMAT_BY_EXTENSION = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".csv": "csv",
                       ".parquet": "parquet"}

