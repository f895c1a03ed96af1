"""``versiq get``, ``versiq keys``, ``versiq history`` and ``versiq lookup``: the answers of the
HTTP API without a server.

The same engine answers and every line printed is the JSON the HTTP API returns
(``service.render``; a key without a value prints the problem object of the 404), so a script
can switch between the CLI and the API. ``--iso`` renders the timestamps of the output as RFC
3339 instants (UTC) for people; the JSON is otherwise unchanged. The engine loads the warehouse
once, without a refresh thread.

Exit status: 0 answered; 2 a usage error (unknown store, bad option, a snapshot that does not
exist); 4 ``versiq get`` found no value (*not found* or *expired*: the problem is printed).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from versiq import storage
from versiq.exits import EXIT_FAILED, EXIT_NO_VALUE, EXIT_OK, EXIT_USAGE
from versiq.query import lookups
from versiq.query.api import (
    InvalidQuery,
    KeysQuery,
    QueryError,
    SnapshotNotFound,
    StoreNotFound,
    UnsupportedQuery,
    VersionedKeyQuery,
)
from versiq.query.engine import Engine
from versiq.service.handlers import key_problem
from versiq.service.render import entry_json, history_json, key_json, result_lines
from versiq.timestamps import TimestampError, format_timestamp, parse_timestamp

#: The members holding epoch-ms instants in the API's JSON (``--iso`` renders them).
TIME_FIELDS = frozenset({"timestamp", "validTo", "committedAt", "deletedAt", "asOf", "horizon"})


class _Usage(Exception):
    """A usage error of the command (exit 2), with its message."""


def _instant(text: str | None, option: str) -> int | None:
    try:
        return None if text is None else parse_timestamp(text)
    except TimestampError as exc:
        raise _Usage(f"{option}: {exc}") from None


def iso_times(value: Any) -> Any:
    """``value`` (parsed API JSON) with every epoch-ms member of ``TIME_FIELDS`` as RFC 3339."""
    if isinstance(value, dict):
        return {k: format_timestamp(v) if k in TIME_FIELDS and isinstance(v, int) and not isinstance(v, bool)
                else iso_times(v) for k, v in value.items()}
    if isinstance(value, list):
        return [iso_times(v) for v in value]
    return value


def _emit(line: bytes, iso: bool) -> None:
    if iso:
        line = json.dumps(iso_times(json.loads(line)), ensure_ascii=False).encode("utf-8")
    sys.stdout.buffer.write(line + b"\n")


@contextmanager
def _engine(args: argparse.Namespace) -> Iterator[Engine]:
    engine = Engine(args.warehouse, refresh_interval_s=3600)
    try:
        engine.refresh()
        yield engine
    finally:
        engine.close()


def _snapshot(engine: Engine, args: argparse.Namespace) -> int | None:
    """``--snapshot``, or the snapshot current at ``--as-of-system-time``."""
    system_time = _instant(getattr(args, "as_of_system_time", None), "--as-of-system-time")
    if system_time is None:
        snapshot: int | None = args.snapshot
        return snapshot
    if args.snapshot is not None:
        raise _Usage("give --snapshot or --as-of-system-time, not both")
    return engine.snapshot_at(args.store, system_time)


def _run(name: str, args: argparse.Namespace, body: Callable[[Engine], int]) -> int:
    """Run ``body`` with a loaded engine; engine errors become the command's messages."""
    if not storage.isdir(args.warehouse):
        print(f"versiq {name}: the warehouse {args.warehouse} does not exist", file=sys.stderr)
        return EXIT_USAGE
    try:
        with _engine(args) as engine:
            status = body(engine)
        sys.stdout.flush()
        return status
    except _Usage as exc:
        print(f"versiq {name}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except StoreNotFound as exc:
        print(f"versiq {name}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (InvalidQuery, UnsupportedQuery, SnapshotNotFound) as exc:
        print(f"versiq {name}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except QueryError as exc:
        print(f"versiq {name}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAILED


def keys_command(args: argparse.Namespace) -> int:
    def body(engine: Engine) -> int:
        query = KeysQuery(args.prefix, args.start, args.end, _instant(args.as_of, "--as-of"), args.include_deleted)
        snapshot = _snapshot(engine, args)
        resume: str | None = None
        while True:
            page = engine.keys(args.store, query, snapshot=snapshot, resume_after=resume, limit=1000)
            snapshot = page.snapshot  # every page from the first page's snapshot
            for entry in page.entries:
                _emit(entry_json(entry), args.iso)
            if page.resume_after is None:
                return EXIT_OK
            resume = page.resume_after

    return _run("keys", args, body)


def get_command(args: argparse.Namespace) -> int:
    def body(engine: Engine) -> int:
        as_of = _instant(args.as_of, "--as-of")
        if not args.key:
            raise _Usage("--key must not be empty")
        result = engine.get(args.store, VersionedKeyQuery(args.key, as_of), snapshot=_snapshot(engine, args))
        if result.outcome == "ok" and result.record is not None:
            _emit(key_json(args.key, result), args.iso)
            return EXIT_OK
        _emit(key_problem(args.store, args.key, as_of, result).body(), args.iso)
        return EXIT_NO_VALUE

    return _run("get", args, body)


def history_command(args: argparse.Namespace) -> int:
    def body(engine: Engine) -> int:
        for commit in json.loads(history_json(args.store, engine.history(args.store)))["commits"]:
            _emit(json.dumps(commit, ensure_ascii=False).encode("utf-8"), args.iso)
        return EXIT_OK

    return _run("history", args, body)


def _read_pairs(path: str) -> list[tuple[str, int | None]]:
    """The pairs of ``--input``: Parquet (``.parquet``) or an Arrow IPC file or stream."""
    try:
        if path.endswith(".parquet"):
            table = pq.read_table(path)
        else:
            try:
                with pa.ipc.open_file(path) as reader:
                    table = reader.read_all()
            except pa.ArrowInvalid:
                with pa.ipc.open_stream(pa.memory_map(path)) as stream:
                    table = stream.read_all()
    except (OSError, pa.ArrowInvalid) as exc:
        raise _Usage(f"--input {path}: {exc}") from None
    try:
        return lookups.pairs_from_table(table)
    except lookups.LookupInputError as exc:
        raise _Usage(f"--input {path}: {exc}") from None


def _write_answers(path: str, table: pa.Table, lines: list[bytes]) -> None:
    """Write the answers by ``--output``'s extension (``.parquet``, ``.arrow``/``.ipc``,
    ``.jsonl``/``.ndjson``), through a temporary file renamed into place."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".versiq-lookup-", dir=folder)
    os.close(fd)
    try:
        if path.endswith(".parquet"):
            pq.write_table(table, tmp, compression="zstd")
        elif path.endswith((".arrow", ".ipc", ".feather")):
            with pa.OSFile(tmp, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
                writer.write_table(table)
        else:
            with open(tmp, "wb") as handle:
                handle.writelines(line + b"\n" for line in lines)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def lookup_command(args: argparse.Namespace) -> int:
    if not args.output.endswith((".parquet", ".arrow", ".ipc", ".feather", ".jsonl", ".ndjson")):
        print("versiq lookup: --output must end in .parquet, .arrow (or .ipc, .feather), .jsonl or .ndjson",
              file=sys.stderr)
        return EXIT_USAGE

    def body(engine: Engine) -> int:
        pairs = _read_pairs(args.input)
        snapshot, results = engine.lookup(args.store, pairs, _snapshot(engine, args))
        table = lookups.answers_table(pairs, results, snapshot)
        problems = {i: key_problem(args.store, key, as_of, r).payload()
                    for i, ((key, as_of), r) in enumerate(zip(pairs, results, strict=True))
                    if r.outcome != "ok" or r.record is None}
        _write_answers(args.output, table, result_lines(pairs, results, problems))
        return EXIT_OK

    return _run("lookup", args, body)


def _print_relation(relation: Any, fmt: str) -> None:
    """A query's result on stdout: DuckDB's table rendering, CSV, or JSON lines."""
    if relation is None:  # a statement without a result
        return
    if fmt == "table":
        relation.show(max_rows=10_000, max_width=200, null_value="NULL")
        return
    table = relation.to_arrow_table()
    if fmt == "csv":
        import pyarrow.csv as pacsv

        sink = pa.BufferOutputStream()
        pacsv.write_csv(table, sink)
        sys.stdout.write(sink.getvalue().to_pybytes().decode("utf-8"))
    else:
        for row in table.to_pylist():
            print(json.dumps(row, ensure_ascii=False, default=str))


def sql_command(args: argparse.Namespace) -> int:
    """``versiq sql``: ``versiq.sql.connect`` in a shell, or one query with ``-c``."""
    import duckdb

    from versiq import sql

    snapshots: dict[str, int] = {}
    for item in args.snapshot_of:
        name, sep, version = item.partition("=")
        if not sep or not version.isdigit():
            print(f"versiq sql: --snapshot-of {item!r}: expected STORE=VERSION", file=sys.stderr)
            return EXIT_USAGE
        snapshots[name] = int(version)
    try:
        con = sql.connect(args.warehouse, snapshots)
    except KeyError as exc:
        print(f"versiq sql: {exc.args[0]}", file=sys.stderr)
        return EXIT_USAGE
    statements = [args.query] if args.query is not None else _statements(sys.stdin)
    status = EXIT_OK
    for statement in statements:
        try:
            _print_relation(con.sql(statement), args.format)
        except duckdb.Error as exc:
            print(f"versiq sql: {exc}", file=sys.stderr)
            status = EXIT_USAGE
            if args.query is not None:
                break
    sys.stdout.flush()
    return status


def _statements(lines: Any) -> Iterator[str]:
    """The statements of a shell's input: text up to each ``;`` at the end of a line."""
    if sys.stdin.isatty():
        print("versiq sql: one view per store and stream; end each statement with ';', Ctrl-D to quit",
              file=sys.stderr)
    pending: list[str] = []
    for line in lines:
        pending.append(line)
        if line.rstrip().endswith(";"):
            text = "".join(pending).strip()
            pending = []
            if text.rstrip(";").strip():
                yield text
    rest = "".join(pending).strip()
    if rest:
        yield rest
