"""The read-only commands, none of which needs a server or Spark: ``rejected``, ``keys``,
``get``, ``lookup``, ``sql`` and ``history``."""

from __future__ import annotations

from typing import Any

from versiq.cli.options import add_logging, add_read_options, add_snapshot_options, add_warehouse, runs


def add_rejected(sub: Any) -> None:
    rej = sub.add_parser(
        "rejected",
        help="list rejected input records of a store",
        description="Print the rejected records of a store, one JSON object per line, ordered "
        "by (run, source, line/row).",
    )
    add_warehouse(rej)
    rej.add_argument("--store", required=True, help="store name")
    rej.add_argument("--reason", default=None, help="only this reason code (e.g. late, malformed)")
    rej.add_argument("--format", choices=("jsonl", "table"), default="jsonl",
                     help="jsonl (default, for scripts) or a human-readable table")
    add_logging(rej)
    rej.set_defaults(run=runs("versiq.ingest.commands", "rejected_command"))


def add_keys(sub: Any) -> None:
    keys = sub.add_parser(
        "keys",
        help="list the keys of a store with their records (no server needed)",
        description="Print the keys of a store in UTF-8 byte order, one JSON object per line, each "
        "with the record a read of the same snapshot answers (latest, or as of --as-of): the "
        "records of GET /v1/stores/{store}/keys, every page, from one snapshot. Keys without a "
        "value are left out; --include-deleted lists a key deleted by a tombstone as "
        '{"key", "timestamp", "validTo", "deleted": true}. Exit 2 for an unknown store or a bad option.',
    )
    add_warehouse(keys)
    keys.add_argument("--store", required=True, help="store name")
    keys.add_argument("--prefix", default=None, help="only keys that start with this")
    keys.add_argument("--start", default=None, help="lowest key (inclusive)")
    keys.add_argument("--end", default=None, help="keys below this one (exclusive)")
    keys.add_argument("--as-of", default=None,
                      help="answer as of this time: epoch ms or RFC 3339 (default: latest)")
    keys.add_argument("--include-deleted", action="store_true", help="also list keys deleted by a tombstone")
    add_read_options(keys)
    add_logging(keys)
    keys.set_defaults(run=runs("versiq.service.offline", "keys_command"))


def add_get(sub: Any) -> None:
    get = sub.add_parser(
        "get",
        help="the record of one key, latest or as of a time (no server needed)",
        description="Print the answer of GET /v1/stores/{store}/keys/{key} as one JSON object: the record "
        '{"key", "value", "timestamp", "validTo", "snapshot"}, or, when the key has no value then, the '
        "problem object of the 404 (not-found, with deletedAt for a tombstone; or expired). Exit 0 with a "
        "record, 4 without a value, 2 for an unknown store or a bad option.",
    )
    add_warehouse(get)
    get.add_argument("--store", required=True, help="store name")
    get.add_argument("--key", required=True, help="the key (any UTF-8 text)")
    get.add_argument("--as-of", default=None, help="answer as of this time: epoch ms or RFC 3339 (default: latest)")
    add_read_options(get)
    add_logging(get)
    get.set_defaults(run=runs("versiq.service.offline", "get_command"))


def add_lookup(sub: Any) -> None:
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
    add_warehouse(look)
    look.add_argument("--store", required=True, help="store name")
    look.add_argument("--input", required=True, help="the pairs: a .parquet file or an Arrow IPC file")
    look.add_argument("--output", required=True, help="where the answers go: .parquet, .arrow or .jsonl")
    add_snapshot_options(look)
    add_logging(look)
    look.set_defaults(run=runs("versiq.service.offline", "lookup_command"))


def add_sql(sub: Any) -> None:
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
    add_warehouse(sql)
    sql.add_argument("--snapshot-of", action="append", default=[], metavar="STORE=V",
                     help="read STORE (or a stream) at Delta version V (repeatable)")
    sql.add_argument("-c", "--command", dest="query", default=None, help="the query to run")
    sql.add_argument("--format", choices=("table", "csv", "json"), default="table",
                     help="table (default, for people), csv, or json (one object per line)")
    add_logging(sql)
    sql.set_defaults(run=runs("versiq.service.offline", "sql_command"))


def add_history(sub: Any) -> None:
    hist = sub.add_parser(
        "history",
        help="the commits (snapshots) of a store, newest first (no server needed)",
        description="Print the commits of GET /v1/stores/{store}/history, one JSON object per line, newest "
        'first: {"snapshot", "committedAt", "operation" (ingest, derive, settings, maintain), "run", '
        '"counts", "files"(, "kafka")}. Exit 2 for an unknown store.',
    )
    add_warehouse(hist)
    hist.add_argument("--store", required=True, help="store name")
    hist.add_argument("--iso", action="store_true", help="print times as RFC 3339 (UTC) instead of epoch ms")
    add_logging(hist)
    hist.set_defaults(run=runs("versiq.service.offline", "history_command"))
