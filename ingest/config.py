"""The YAML pipeline file of ``versiq ingest --config`` (issue #3):

```yaml
stores:
  - name: prices                 # letters, digits, _ - .
    source: data/prices/         # a file or a directory (recursive); relative to the YAML file
    format: jsonl                # jsonl | csv | parquet (default: by file extension)
    kind: versioned              # versioned | timestamped
    history_retention: 7d        # ms integer, 5m / 12h / 7d, or ISO-8601 (P7D)
    partitions: 4
    buckets: 16                  # optional physical layout
```
Errors are ``UsageError`` naming the store and the field, raised before any data is touched.
"""

from __future__ import annotations

import os
from typing import Any

import yaml

from ingest.pipeline import StoreSpec
from ingest.store import UsageError
from versiq.durations import DurationError, parse_duration_ms

_STORE_FIELDS = {"name", "source", "format", "kind", "history_retention", "partitions", "buckets"}


def load_config(path: str) -> list[StoreSpec]:
    try:
        with open(path, encoding="utf-8") as handle:
            data = yaml.safe_load(handle)
    except OSError as exc:
        raise UsageError(f"cannot read config {path}: {exc}") from None
    except yaml.YAMLError as exc:
        raise UsageError(f"config {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("stores"), list) or not data["stores"]:
        raise UsageError(f"config {path}: expected a non-empty 'stores:' list")
    unknown_top = set(data) - {"stores", "streams", "tables"}
    if unknown_top:
        raise UsageError(f"config {path}: unknown top-level key(s): {', '.join(sorted(unknown_top))}")
    for section in ("streams", "tables"):
        if data.get(section):
            raise UsageError(f"config {path}: '{section}:' (derived tables) is not supported yet")
    base = os.path.dirname(os.path.abspath(path))
    return [_store(entry, i, base) for i, entry in enumerate(data["stores"])]


def _store(entry: Any, index: int, base: str) -> StoreSpec:
    where = f"stores[{index}]"
    if not isinstance(entry, dict):
        raise UsageError(f"{where}: expected a mapping")
    unknown = set(entry) - _STORE_FIELDS
    if unknown:
        raise UsageError(f"{where}: unknown field(s): {', '.join(sorted(unknown))}")
    for required in ("name", "source"):
        if not isinstance(entry.get(required), str) or not entry[required]:
            raise UsageError(f"{where}: '{required}' is required (a string)")
    retention = entry.get("history_retention")
    retention_ms = None
    if retention is not None:
        try:
            retention_ms = parse_duration_ms(retention)
        except DurationError as exc:
            raise UsageError(f"{where} ({entry['name']}): history_retention: {exc}") from None
    for name in ("partitions", "buckets"):
        if name in entry and (not isinstance(entry[name], int) or isinstance(entry[name], bool)):
            raise UsageError(f"{where} ({entry['name']}): '{name}' must be an integer")
    source = entry["source"]
    if not os.path.isabs(source):
        source = os.path.join(base, source)
    return StoreSpec(
        name=entry["name"],
        source=source,
        format=entry.get("format"),
        kind=entry.get("kind"),
        history_retention_ms=retention_ms,
        partitions=entry.get("partitions"),
        buckets=entry.get("buckets"),
    )
