"""Helpers for ingest tests: write changelog files, read a store back independently of query/
(a local one, or one on S3 through ``versiq.storage``).

Stores are read here with DuckDB and the layout's read rule directly (not through the query
engine), so ingest tests check the on-disk contract itself.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass

from tests.support.reference import InRecord
from versiq import storage
from versiq.layout import has_table, read_state


def record_line(r: InRecord) -> str:
    parts = [f'"key":{json.dumps(r.key)}']
    if r.value is not None:
        parts.append(f'"value":{r.value}')
    parts.append(f'"timestamp":{r.timestamp}')
    if r.partition is not None:
        parts.append(f'"partition":{r.partition}')
    if r.offset is not None:
        parts.append(f'"offset":{r.offset}')
    return "{" + ",".join(parts) + "}"


def write_jsonl(folder: str, name: str, lines: list[str]) -> str:
    path = os.path.join(folder, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")
    return path


@contextlib.contextmanager
def expressions(*, generated: bool, parsed_here: bool | None = None) -> Iterator[None]:
    """Runs inside plan as a large run does (``generated``: generated code, adaptive execution,
    the session's shuffle partitions, the run's keys in a job of their own), or as a small run
    does by default (``ingest.spark.plans_for_input``: interpreted expressions, no adaptive
    execution, a shuffle partition per core, the keys with the parse statistics); and parse
    their files in this process and decide them there with DuckDB (``parsed_here``,
    ``parse.parse_here``, ``ingest.decisions_here``: a run of up to ``plan.PARSE_HERE_BYTES``)
    or parse them in Spark tasks and decide them in Spark (a larger one, ``VERSIQ_PARSE_HERE_BYTES``);
    None: as the run's size says. Every combination must write the same store. A table parsed
    here is spread over every core however small (``frames.SPREAD_ROWS``), as a larger run's
    is. (pytest's
    ``monkeypatch`` fixture is per test; hypothesis examples need a scope of their own.)"""
    import pytest

    from versiq.ingest.plan import PARSE_HERE_BYTES, PARSE_HERE_BYTES_ENV
    from versiq.ingest.spark import INTERPRETED_RUN_BYTES_ENV

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("versiq.ingest.frames.SPREAD_ROWS", 2)
        if generated:
            patch.setenv(INTERPRETED_RUN_BYTES_ENV, "0")
        else:
            patch.delenv(INTERPRETED_RUN_BYTES_ENV, raising=False)
        if parsed_here is None:
            patch.delenv(PARSE_HERE_BYTES_ENV, raising=False)
        else:
            patch.setenv(PARSE_HERE_BYTES_ENV, str(PARSE_HERE_BYTES) if parsed_here else "0")
        yield


def records_from(source: str, specs: list[tuple]) -> list[InRecord]:
    """(key, value_text|None, ts[, partition[, offset]]) tuples -> InRecords numbered as lines."""
    out = []
    for i, spec in enumerate(specs, start=1):
        key, value, ts, *rest = spec
        part = rest[0] if rest else None
        offset = rest[1] if len(rest) > 1 else None
        out.append(InRecord(source, i, key, value, ts, part, offset))
    return out


@dataclass(frozen=True)
class StoredVersion:
    timestamp: int
    value: str | None
    valid_to: int | None


def store_versions(path: str, version: int | None = None) -> dict[str, list[StoredVersion]]:
    """Every version per key (tombstones included) after the read rule, ascending."""
    files = storage.delta_table(path, version).file_uris()
    out: dict[str, list[StoredVersion]] = {}
    if not files:
        return out
    con = storage.duckdb_connect(path)
    # the layout contract (versiq.layout): a run writes at most one row per (key, valid_from),
    # so the read rule never has to choose between two rows of one run
    twice = con.sql("SELECT key, valid_from, run FROM read_parquet($files) GROUP BY ALL HAVING count(*) > 1",
                       params={"files": files}).fetchall()
    assert not twice, f"rows written twice by one run: {twice[:5]}"
    rows = con.sql(
        "SELECT key, valid_from, value, valid_to, tombstone FROM read_parquet($files) "
        "QUALIFY row_number() OVER (PARTITION BY key, valid_from ORDER BY run DESC) = 1 "
        "ORDER BY key, valid_from",
        params={"files": files},
    ).fetchall()
    for key, valid_from, value, valid_to, tombstone in rows:
        assert (value is None) == tombstone
        out.setdefault(key, []).append(StoredVersion(valid_from, value, valid_to))
    return out


def timestamped_values(path: str) -> dict[str, tuple[str | None, int]]:
    files = storage.delta_table(path).file_uris()
    if not files:
        return {}
    rows = storage.duckdb_connect(path).sql(
        "SELECT key, value, valid_from FROM read_parquet($files) "
        "QUALIFY row_number() OVER (PARTITION BY key ORDER BY run DESC) = 1",
        params={"files": files},
    ).fetchall()
    return {k: (v, t) for k, v, t in rows}


def stream_times(path: str) -> dict[int, int]:
    return read_state(path, storage.delta_table(path).version()).stream_time


def rejected_rows(path: str) -> list[dict]:
    rej = storage.join(path, "_rejected")
    if not has_table(rej):
        return []
    return storage.delta_table(rej).to_pyarrow_table().to_pylist()


def model_versions(model, keys) -> dict[str, list[StoredVersion]]:
    out = {}
    for key in keys:
        vs = model.all_versions(key)
        if vs:
            out[key] = [StoredVersion(v.timestamp, v.value, v.valid_to) for v in vs]
    return out


def ingest_in_process(spark, *argv: str) -> tuple[int, str]:
    """``versiq ingest ARGV`` run by this process in the session's Spark: the CLI's parser and
    command (``ingest_command`` given a session, as the resident driver runs it), so the same
    pipeline, report and exit status as the process, without a JVM start. Returns the exit status
    and what the command printed on stderr (its summary)."""
    import io

    from versiq.cli.main import build_parser
    from versiq.ingest.commands import ingest_command

    parser = build_parser()
    args = parser.parse_args(["ingest", *argv])
    printed = io.StringIO()
    with contextlib.redirect_stderr(printed):
        status = ingest_command(args, parser, spark=spark)
    return status, printed.getvalue()


def erase_in_process(spark, *argv: str) -> tuple[int, str, str]:
    """``versiq erase ARGV`` run by this process in the session's Spark: the CLI's parser and
    command (``erase_command``, its Spark session the given one), so the same erase, output and
    exit status as the process, without a JVM start. Returns the exit status, stdout and stderr
    (what the command prints and its log records, at the CLI's level and in its format, as the
    process writes them to stderr; the session JVM's own log is not in it)."""
    import functools
    import io
    import logging

    import pytest

    from versiq.cli.main import build_parser
    from versiq.ingest import erase
    from versiq.ingest.commands import erase_command

    args = build_parser().parse_args(["erase", *argv])
    out, err = io.StringIO(), io.StringIO()
    handler = logging.StreamHandler(err)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.setLevel(args.log_level.upper())
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(min(level, handler.level) if level else handler.level)
    try:
        with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            patch.setattr(erase, "erase_keys", functools.partial(erase.erase_keys, spark=lambda: spark))
            status = erase_command(args)
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    return status, out.getvalue(), err.getvalue()


def get_in_process(*argv: str) -> tuple[int, str]:
    """``versiq get ARGV`` run by this process: the CLI's parser and command (the read path of
    GET /v1/stores/{store}/keys/{key}, no server), without a process start. Returns the exit
    status and what the command printed on stdout."""
    import io

    from versiq.cli.main import build_parser
    from versiq.service.offline import get_command

    args = build_parser().parse_args(["get", *argv])
    raw = io.BytesIO()
    printed = io.TextIOWrapper(raw, encoding="utf-8")  # the command writes its bytes to stdout.buffer
    with contextlib.redirect_stdout(printed):
        status = get_command(args)
    printed.flush()
    return status, raw.getvalue().decode("utf-8")
