"""How answers look on the wire: the JSON of stores, streams, records and pages (field names are
the contract of openapi.yaml). Record bodies are assembled from bytes: a stored value is compact
JSON text already and goes out verbatim (``1.50`` stays ``1.50``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from versiq.query.api import ChangesPage, KeyEntry, KeyResult, KeysPage, RejectedPage, StoreInfo, VersionsPage
from versiq.query.history import Commit
from versiq.query.streams import StreamInfo, StreamRecordsPage

JSON = "application/json"


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


#: A str as a JSON string, exactly as ``dumps`` writes it (the encoder's own C function: a key
#: per record of a page of 1,000 is where ``json.dumps``'s set-up cost showed).
string_json: Callable[[str], str] = json.encoder.encode_basestring  # type: ignore[attr-defined]


def int_or_null(value: int | None) -> bytes:
    return b"null" if value is None else b"%d" % value


def _int_text(value: int | None) -> str:
    return "null" if value is None else str(value)


def store_info_json(info: StoreInfo) -> dict[str, Any]:
    """One entry of ``GET /v1/stores`` and the body of ``GET /v1/stores/{store}``."""
    versioned = info.kind == "versioned"
    per_partition = []
    for partition in sorted(info.stream_time):
        st = info.stream_time[partition]
        per_partition.append({
            "partition": partition,
            "streamTime": st,
            "oldestQueryableTimestamp": max(0, st - info.history_retention_ms) if versioned else None,
        })
    stream_time = max(info.stream_time.values()) if info.stream_time else None
    oldest = None
    if versioned and stream_time is not None:
        oldest = max(0, stream_time - info.history_retention_ms)
    return {
        "name": info.name,
        "kind": info.kind,
        "historyRetentionMs": info.history_retention_ms,
        "partitions": info.partitions,
        "streamTime": stream_time,
        "partitionStreamTimes": per_partition,
        "snapshot": info.snapshot,
        "oldestQueryableTimestamp": oldest,
        "counts": dict(info.counts),
        "inputs": dict(info.inputs),
        "sources": {name: {"run": v["run"], "snapshot": v["snapshot"]} for name, v in info.sources.items()},
    }


def stream_info_json(info: StreamInfo) -> dict[str, Any]:
    return {
        "name": info.name,
        "snapshot": info.snapshot,
        "lastRun": info.last_run,
        "buckets": info.buckets,
        "counts": dict(info.counts),
        "minTimestamp": info.min_timestamp,
        "maxTimestamp": info.max_timestamp,
        "inputs": dict(info.inputs),
        "sources": {name: {"run": v["run"], "snapshot": v["snapshot"]} for name, v in info.sources.items()},
    }


def key_json(key: str, result: KeyResult) -> bytes:
    """A found record of ``GET .../keys/{key}``."""
    rec = result.record
    assert rec is not None and rec.value is not None
    return b"".join((
        b'{"key":', dumps(key), b',"value":', rec.value.encode("utf-8"),
        b',"timestamp":', int_or_null(rec.timestamp),
        b',"validTo":', int_or_null(rec.valid_to),
        b',"snapshot":', int_or_null(result.snapshot), b"}",
    ))


def versions_json(key: str, page: VersionsPage, next_token: str | None) -> bytes:
    """A page of ``GET .../keys/{key}/versions``."""
    records = b",".join(
        b"".join((b'{"timestamp":', int_or_null(r.timestamp), b',"validTo":', int_or_null(r.valid_to),
                  b',"deleted":true}'))
        if r.value is None else
        b"".join((b'{"value":', r.value.encode("utf-8"), b',"timestamp":',
                  int_or_null(r.timestamp), b',"validTo":', int_or_null(r.valid_to), b"}"))
        for r in page.records
    )
    return b"".join((
        b'{"key":', dumps(key), b',"records":[', records, b'],"nextPageToken":',
        dumps(next_token), b',"snapshot":', int_or_null(page.snapshot),
        b',"horizon":', int_or_null(page.horizon), b',"truncated":', b"true" if page.truncated else b"false", b"}",
    ))


def stream_records_json(stream: str, key: str | None, page: StreamRecordsPage, next_token: str | None) -> bytes:
    """A page of ``GET /v1/streams/{stream}/records``."""
    records = b",".join(
        b"".join((b'{"key":', dumps(r.key), b',"value":',
                  b"null" if r.value is None else r.value.encode("utf-8"),
                  b',"timestamp":', int_or_null(r.timestamp), b',"run":', int_or_null(r.run),
                  b',"sequence":', int_or_null(r.sequence), b"}"))
        for r in page.records
    )
    return b"".join((
        b'{"stream":', dumps(stream), b',"key":', dumps(key), b',"records":[', records,
        b'],"nextPageToken":', dumps(next_token), b',"snapshot":', int_or_null(page.snapshot), b"}",
    ))


def entry_json(e: KeyEntry) -> bytes:
    """One record of a key listing (also one line of ``versiq keys``)."""
    if e.deleted:
        return (f'{{"key":{string_json(e.key)},"timestamp":{e.timestamp},"validTo":{_int_text(e.valid_to)},'
                '"deleted":true}').encode()
    assert e.value is not None
    return (f'{{"key":{string_json(e.key)},"value":{e.value},"timestamp":{e.timestamp},'
            f'"validTo":{_int_text(e.valid_to)}}}').encode()


def keys_json(store: str, page: KeysPage, next_token: str | None) -> bytes:
    """A page of ``GET /v1/stores/{store}/keys``: records in the shape of ``/versions`` with
    their key; a deleted entry has ``deleted: true`` and no ``value``."""
    return b"".join((
        b'{"store":', dumps(store), b',"records":[', b",".join(entry_json(e) for e in page.entries),
        b'],"nextPageToken":', dumps(next_token), b',"snapshot":', int_or_null(page.snapshot), b"}",
    ))


def batch_json(store: str, snapshot: int, keys: list[str], as_of: int | None, results: list[KeyResult],
               problems: dict[int, dict[str, Any]]) -> bytes:
    """The answer of ``POST /v1/stores/{store}/keys:batchGet``: one result per requested key, in
    request order, each a record or the problem the single-key read would give."""
    parts = result_lines([(key, as_of) for key in keys], results, problems)
    return b"".join((b'{"store":', dumps(store), b',"snapshot":', int_or_null(snapshot), b',"results":[',
                     b",".join(parts), b"]}"))


def result_lines(pairs: list[tuple[str, int | None]], results: list[KeyResult],
                 problems: dict[int, dict[str, Any]]) -> list[bytes]:
    """One result object per ``(key, asOf)`` pair (``keys:batchGet``, ``lookups``; a line of their
    NDJSON): ``{"key", "asOf"?, "record"}`` or ``{"key", "asOf"?, "problem"}``."""
    parts = []
    for i, ((key, as_of), result) in enumerate(zip(pairs, results, strict=True)):
        head = f'{{"key":{string_json(key)}' + ("" if as_of is None else f',"asOf":{as_of}')
        if i in problems:
            parts.append((head + ',"problem":').encode() + dumps(problems[i]) + b"}")
            continue
        rec = result.record
        assert rec is not None and rec.value is not None
        parts.append(f'{head},"record":{{"value":{rec.value},"timestamp":{rec.timestamp},'
                     f'"validTo":{_int_text(rec.valid_to)}}}}}'.encode())
    return parts


def changes_json(store: str, page: ChangesPage, next_token: str | None) -> bytes:
    """A page of ``GET /v1/stores/{store}/changes``: ``{"key", "value"?, "timestamp", "validTo",
    "deleted", "snapshot"}`` per change (no ``value`` on a tombstone)."""
    items = b",".join(
        b"".join((b'{"key":', dumps(c.key), b"" if c.value is None else b',"value":' + c.value.encode("utf-8"),
                  b',"timestamp":', int_or_null(c.timestamp), b',"validTo":', int_or_null(c.valid_to),
                  b',"deleted":', b"true" if c.value is None else b"false",
                  b',"snapshot":', int_or_null(c.snapshot), b"}"))
        for c in page.changes)
    return b"".join((b'{"store":', dumps(store), b',"changes":[', items, b'],"nextPageToken":', dumps(next_token),
                     b',"snapshot":', int_or_null(page.snapshot), b"}"))


def change_lines(snapshot: int, batch: pa.RecordBatch) -> bytes:
    """NDJSON lines of one batch of a commit's changes (``query.changes.commit_batches``): the
    objects of ``changes_json``, one per line."""
    tail = b',"snapshot":' + str(snapshot).encode() + b"}\n"
    keys, stamps, valid_to, values = (batch.column(i).to_pylist() for i in range(4))
    return b"".join(
        b"".join((b'{"key":', dumps(k), b"" if v is None else b',"value":' + v.encode("utf-8"),
                  b',"timestamp":', str(t).encode(), b',"validTo":', b"null" if vt is None else str(vt).encode(),
                  b',"deleted":', b"true" if v is None else b"false", tail))
        for k, t, vt, v in zip(keys, stamps, valid_to, values, strict=True))


def history_json(store: str, commits: list[Commit]) -> bytes:
    """``GET /v1/stores/{store}/history``: the store's commits, newest first."""
    return dumps({"store": store, "commits": [
        {"snapshot": c.snapshot, "committedAt": c.committed_at, "operation": c.operation, "run": c.run,
         "counts": dict(c.counts), "files": list(c.files), **({"kafka": c.kafka} if c.kafka is not None else {})}
        for c in commits]})


def rejected_json(store: str, page: RejectedPage, next_token: str | None) -> bytes:
    """A page of ``GET /v1/stores/{store}/rejected``: the records as ``versiq rejected`` prints
    them (``_rejected_record``), with the counts per reason and the total."""
    records = [_rejected_record(record) for record in page.records]
    return dumps({"store": store, "snapshot": page.snapshot, "counts": page.counts, "total": page.total,
                  "records": records, "nextPageToken": next_token})


def rejected_record_json(store: str, snapshot: int, record: dict[str, Any]) -> bytes:
    """``GET /v1/stores/{store}/rejected/{id}``: one record, its raw text whole."""
    return dumps({"store": store, "snapshot": snapshot, "record": _rejected_record(record)})


def _rejected_record(record: dict[str, Any]) -> dict[str, Any]:
    """A record as ``versiq rejected`` prints it, with ``ingestedAt`` for the CLI's
    ``ingested_at``, and its ``id``, ``rawLength`` and ``rawTruncated`` (``query.rejected``)."""
    out = dict(record)
    out["ingestedAt"] = out.pop("ingested_at")
    out["rawLength"] = out.pop("raw_length")
    out["rawTruncated"] = out.pop("raw_truncated")
    return out
