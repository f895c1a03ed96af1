"""A large run parsed in the driver is parsed by worker processes, JSONL files in pieces cut at
line ends (``ingest.parse_workers``). Whatever the pieces, the run's table must be the one a
parse in one process gives, row for row: line numbers, rejections and their text, byte order
marks, CRLF, blank lines, lines longer than a piece, a last line without a newline, records
refused by ``max_future``, CSV files beside JSONL ones."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import versiq.ingest.parse as parse_module
import versiq.ingest.parse_workers as parse_workers
from versiq.ingest.parse import parse_here
from versiq.ingest.parse_workers import PARSE_WORKERS_ENV, Piece, WorkerRun, cpu_quota, line_starts, plan_pieces
from versiq.ingest.records import MAX_RECORD_BYTES
from versiq.ingest.sources import SourceError
from versiq.layout import MURMUR2, Partitioning

_LINES = [
    b'{"key":"a","value":{"n":1},"timestamp":5}',
    b'{"key":"b","value":null,"timestamp":7}',
    b'{"key": "c", "value": [1, 2.50], "timestamp": "1970-01-01T00:00:00.009Z"}',
    b'{"key":"d","value":"x","timestamp":90000000000}',  # past max_future in some examples
    b'{"key":"e","value":1,"timestamp":3,"partition":0,"offset":4}',
    b"{not json",
    b'{"value":1,"timestamp":5}',
    b"\xff\xfe not UTF-8",
    b'\xef\xbb\xbf{"key":"f","value":1,"timestamp":1}',  # a byte order mark inside the file: malformed
    b"",
    b"   ",
    b'{"key":"' + b"l" * 300 + b'","value":1,"timestamp":2}',  # longer than most pieces
]


@st.composite
def jsonl_file(draw) -> bytes:
    lines = draw(st.lists(st.sampled_from(_LINES), max_size=30))
    endings = draw(st.lists(st.sampled_from([b"\n", b"\r\n"]), min_size=len(lines), max_size=len(lines)))
    body = b"".join(line + end for line, end in zip(lines, endings, strict=True))
    if lines and draw(st.booleans()):
        body = body.rstrip(b"\r\n")  # no newline after the last line
    if draw(st.booleans()):
        body = b"\xef\xbb\xbf" + body
    return body


@pytest.fixture
def in_pieces(monkeypatch):
    """Every run parsed here is parsed by two workers, whatever its size."""
    monkeypatch.setattr(parse_workers, "PARALLEL_PARSE_BYTES", 0)
    monkeypatch.setenv(PARSE_WORKERS_ENV, "2")


def _here(files: dict[str, str], partitions: int | None = None, max_timestamp: int | None = None, **options):
    """``parse_here`` as a run's plan has it parse (``ingest.plan``): in pieces for the worker
    processes ``VERSIQ_PARSE_WORKERS`` asks for, when the run is large enough."""
    workers = parse_workers.parse_workers()
    return parse_here(files, None, _partitioning(partitions), max_timestamp, pieces=plan_pieces(files, None, workers),
                      workers=workers, **options)


def workers_must_not_fail(why: str) -> None:
    """Stands for ``parse._parse_here_instead`` where a run must be parsed by the workers: their
    failure would go unseen, parsing the run again in one process gives the same table."""
    raise AssertionError(f"the parse workers failed: {why}")


def _partitioning(partitions: int | None) -> Partitioning | None:
    return None if partitions is None else Partitioning(partitions, MURMUR2)


def _parse_both(files: dict[str, str], partitions: int | None, max_timestamp: int | None, piece_bytes: int):
    alone = parse_here(files, None, _partitioning(partitions), max_timestamp)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(parse_module, "_parse_here_instead", workers_must_not_fail)
        patch.setattr(parse_workers, "PARALLEL_PARSE_BYTES", 0)
        pieces = plan_pieces(files, None, 2, piece_bytes)
        in_workers = parse_here(files, None, _partitioning(partitions), max_timestamp, pieces=pieces, workers=2)
    return alone, in_workers


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(jsonl_file(), min_size=1, max_size=3), st.integers(1, 200), st.sampled_from([None, 1, 3]),
       st.sampled_from([None, 10**10]))
def test_pieces_parsed_by_workers_give_the_table_of_one_process(tmp_path_factory, files, piece_bytes, partitions,
                                                                max_timestamp):
    folder = tmp_path_factory.mktemp("pieces")
    paths = {}
    for i, body in enumerate(files):
        path = folder / f"f{i}.jsonl"
        path.write_bytes(body)
        paths[path.name] = str(path)
    alone, in_workers = _parse_both(paths, partitions, max_timestamp, piece_bytes)
    assert in_workers.schema == alone.schema
    assert in_workers.to_pylist() == alone.to_pylist()


def test_csv_files_are_parsed_whole_beside_pieces_of_jsonl(tmp_path):
    csv = tmp_path / "a.csv"
    csv.write_text('key,value,timestamp\nk1,"{""n"":1}",5\nk2,"two\nlines",6\nk3,,x\n', encoding="utf-8")
    jsonl = tmp_path / "b.jsonl"
    jsonl.write_bytes(b"".join(_LINES[:6] + [b""]).replace(b"}{", b"}\n{") + b"\n" + b"\n".join(_LINES))
    files = {"a.csv": str(csv), "b.jsonl": str(jsonl)}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(parse_workers, "PARALLEL_PARSE_BYTES", 0)
        pieces = plan_pieces(files, None, 2, piece_bytes=40)
    assert pieces is not None
    assert [(p.source, p.span is None) for p in pieces][0] == ("a.csv", True)
    assert len([p for p in pieces if p.source == "b.jsonl"]) > 2
    alone, in_workers = _parse_both(files, 1, None, 40)
    assert in_workers.to_pylist() == alone.to_pylist()
    assert alone.num_rows > 10


def test_pieces_start_at_line_starts(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_bytes(b"aaaa\nbb\n" + b"c" * 50 + b"\nd\ne")
    assert line_starts(str(path), 4) == [0, 5, 59]  # the next line start at least 4 bytes on
    assert line_starts(str(path), 3) == [0, 5, 8, 59]
    assert line_starts(str(path), 1) == [0, 5, 8, 59, 61]
    assert line_starts(str(path), 1000) == [0]


def test_a_small_run_or_one_worker_parses_in_this_process(tmp_path, monkeypatch):
    path = tmp_path / "a.jsonl"
    path.write_bytes(b"\n".join(_LINES) * 10)
    files = {"a.jsonl": str(path)}
    assert plan_pieces(files, None, 2, piece_bytes=40) is None  # below PARALLEL_PARSE_BYTES
    monkeypatch.setattr(parse_workers, "PARALLEL_PARSE_BYTES", 0)
    assert plan_pieces(files, None, 1, piece_bytes=40) is None
    assert plan_pieces(files, None, 2, piece_bytes=10**6) is None  # one piece
    assert len(plan_pieces(files, None, 2, piece_bytes=40) or []) > 10
    monkeypatch.setenv(PARSE_WORKERS_ENV, "many")
    with pytest.raises(ValueError, match="VERSIQ_PARSE_WORKERS='many': expected a number of processes"):
        parse_workers.parse_workers()
    monkeypatch.setenv(PARSE_WORKERS_ENV, "3")
    assert parse_workers.parse_workers() == 3
    monkeypatch.delenv(PARSE_WORKERS_ENV)
    assert parse_workers.parse_workers() == len(os.sched_getaffinity(0))


def test_a_file_a_worker_cannot_read_fails_the_run_naming_it(tmp_path, in_pieces):
    good = tmp_path / "a.jsonl"
    good.write_bytes(b"\n".join(_LINES))
    folder = tmp_path / "b.jsonl"
    folder.mkdir()  # its size is known, but a worker cannot read it
    files = {"a.jsonl": str(good), "b.jsonl": str(folder)}
    assert plan_pieces(files, None, 2) is not None
    with pytest.raises(SourceError, match=f"cannot read source file {folder}: Is a directory"):
        _here(files)
    missing = {"a.jsonl": str(good), "c.jsonl": str(tmp_path / "c.jsonl")}
    with pytest.raises(SourceError, match="cannot read source file .*c.jsonl: No such file or directory"):
        _here(missing)


def test_a_run_over_max_rows_in_workers_is_none(tmp_path, in_pieces, monkeypatch):
    monkeypatch.setattr(parse_workers, "PIECE_BYTES", 50)
    path = tmp_path / "a.jsonl"
    path.write_bytes(b"".join(b'{"key":"k%d","value":1,"timestamp":1}\n' % i for i in range(40)))
    files = {"a.jsonl": str(path)}
    assert _here(files, max_rows=40) is not None
    assert _here(files, max_rows=39) is None


def test_a_dead_worker_makes_the_run_parse_in_this_process(tmp_path, in_pieces, monkeypatch, caplog):
    """A worker killed (out of memory, by hand) breaks the pool: the run still completes,
    parsed in the driver, and the next run starts a new pool."""
    monkeypatch.setattr(parse_workers, "PIECE_BYTES", 100)
    path = tmp_path / "a.jsonl"
    path.write_bytes(b"\n".join(_LINES * 5))
    files = {"a.jsonl": str(path)}
    expected = _here(files).to_pylist()  # starts the pool
    pool = parse_workers._executor(2)
    for pid in list(pool._processes):  # type: ignore[attr-defined]
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while not pool._broken and time.monotonic() < deadline:  # type: ignore[attr-defined]
        time.sleep(0.05)
    assert pool._broken  # type: ignore[attr-defined]
    with caplog.at_level(logging.WARNING, logger="versiq.ingest"):
        assert _here(files).to_pylist() == expected
    assert "the process pool is not usable anymore: this run parses in the driver" in caplog.text
    assert parse_workers._pool is None  # stopped: the next run starts another
    assert _here(files).to_pylist() == expected
    assert parse_workers._executor(2) is not pool


_ENDS = """
import os, sys
import versiq.ingest.parse as parse_module
import versiq.ingest.parse_workers as parse_workers
from versiq.ingest.parse import parse_here
from versiq.ingest.parse_workers import plan_pieces


def _here(files):
    workers = parse_workers.parse_workers()
    return parse_here(files, None, None, pieces=plan_pieces(files, None, workers), workers=workers)


parse_workers.PARALLEL_PARSE_BYTES = 0
parse_workers.PIECE_BYTES = 50
os.environ["VERSIQ_PARSE_WORKERS"] = "2"
table = _here({"a.jsonl": sys.argv[1]})
print(table.num_rows, *parse_workers._executor(2)._processes, flush=True)
if sys.argv[2] == "cli":
    from versiq.cli.main import _stop_parse_workers
    _stop_parse_workers()
os._exit(0)  # as the CLI ends (cli.main.run): no exit handlers
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("end", ["cli", "killed"])
def test_workers_end_with_the_process_that_started_them(tmp_path, end):
    """The CLI stops the pool before it ends its process (no semaphore reported as leaked);
    a process that ends without doing so (killed, ``os._exit``) takes its workers with it, who
    would otherwise wait for work forever, holding its stdout open."""
    path = tmp_path / "a.jsonl"
    path.write_bytes(b"".join(b'{"key":"k%d","value":1,"timestamp":1}\n' % i for i in range(40)))
    done = subprocess.run([sys.executable, "-c", _ENDS, str(path), end], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stderr[-3000:]
    rows, *pids = (int(word) for word in done.stdout.split())
    assert rows == 40 and pids
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in pids)
    if end == "cli":
        assert "leaked" not in done.stderr, done.stderr


def test_relative_paths_are_read_from_the_callers_directory(tmp_path, in_pieces, monkeypatch):
    """A resident driver runs each request in its caller's directory; the workers stay in the
    one they started in."""
    monkeypatch.setattr(parse_workers, "PIECE_BYTES", 100)
    started = tmp_path / "started"
    started.mkdir()
    monkeypatch.chdir(started)
    path = tmp_path / "a.jsonl"
    path.write_bytes(b"\n".join(_LINES * 3))
    monkeypatch.setattr(parse_module, "_parse_here_instead", workers_must_not_fail)
    expected = _here({"a.jsonl": str(path)}).to_pylist()  # the pool starts (if not yet)
    monkeypatch.chdir(tmp_path)
    assert _here({"a.jsonl": "a.jsonl"}).to_pylist() == expected


def test_an_error_in_a_worker_fails_the_run_with_its_text_and_keeps_the_pool(tmp_path, in_pieces):
    """An exception a worker raises reaches the run as text (not every exception can be
    pickled back), names the piece, and leaves the pool in service."""
    path = tmp_path / "a.parquet"
    path.write_bytes(b"PAR1")
    with pytest.raises(RuntimeError, match=r"parsing a.parquet \(bytes \(0, 4\)\): ValueError: only a JSONL file "
                                           r"can be parsed in pieces, not parquet"), \
            WorkerRun.start([Piece(0, str(path), "a.parquet", "parquet", (0, 4))], None, 2) as run:
        for _index, batches in run.files():
            list(batches)
    assert parse_workers._pool is run.pool and not run.pool._broken  # type: ignore[attr-defined]


_NO_START = """
import logging, os, sys, multiprocessing
import versiq.ingest.parse_workers as parse_workers
from versiq.ingest.parse import parse_here
from versiq.ingest.parse_workers import plan_pieces


def _here(files):
    workers = parse_workers.parse_workers()
    return parse_here(files, None, None, pieces=plan_pieces(files, None, workers), workers=workers)


logging.basicConfig(level=logging.WARNING)
parse_workers.PARALLEL_PARSE_BYTES = 0
parse_workers.PIECE_BYTES = 50
files = {"a.jsonl": sys.argv[1]}
os.environ["VERSIQ_PARSE_WORKERS"] = "1"
alone = _here(files)
os.environ["VERSIQ_PARSE_WORKERS"] = "2"
multiprocessing.set_executable("/nonexistent/python")  # the fork server cannot start
assert _here(files).equals(alone)
print("same table", parse_workers._pool is None)
"""


def test_a_pool_that_cannot_start_makes_the_run_parse_in_this_process(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_bytes(b"".join(b'{"key":"k%d","value":1,"timestamp":1}\n' % i for i in range(40)))
    done = subprocess.run([sys.executable, "-c", _NO_START, str(path)], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["same", "table", "True"]
    assert "the parse workers could not start" in done.stderr and "this run parses in the driver" in done.stderr


@pytest.mark.parametrize(("text", "cores"), [("200000 100000\n", 2), ("150000 100000\n", 1), ("50000 100000\n", 0),
                                             ("max 100000\n", None), ("", None)])
def test_the_cgroup_cpu_quota_caps_the_workers(tmp_path, monkeypatch, text, cores):
    cpu_max = tmp_path / "cpu.max"
    cpu_max.write_text(text)
    assert cpu_quota(str(cpu_max)) == cores
    assert cpu_quota(str(tmp_path / "none")) is None
    monkeypatch.delenv(PARSE_WORKERS_ENV, raising=False)
    monkeypatch.setattr(parse_workers, "cpu_quota", lambda: cores)
    expected = len(os.sched_getaffinity(0)) if cores is None else max(1, min(len(os.sched_getaffinity(0)), cores))
    assert parse_workers.parse_workers() == expected


def test_a_csv_value_over_the_record_limit_is_one_rejection_in_workers(tmp_path):
    filler = "x" * 200 + "\n"
    value = filler * (MAX_RECORD_BYTES // len(filler) + 10) + "smuggled,1,1700000000001\n" + filler
    (tmp_path / "a.csv").write_text(f'key,value,timestamp\nk,"{value}",5\nafter,1,6\n', encoding="utf-8")
    alone, in_workers = _parse_both({"a.csv": str(tmp_path / "a.csv")}, None, None, 40)
    assert in_workers.to_pylist() == alone.to_pylist()
    rows = sorted((r["seq"], r["key"], r["reason"]) for r in alone.to_pylist())  # one file: seq is the line
    assert rows == [(2, None, "too_large"), (2 + value.count("\n") + 1, "after", None)]
