"""A large run parsed in the driver (``parse.parse_here``) is parsed by worker processes of this
host, one per core.

The parsers (``ingest.records``) are Python, one record at a time: about 3 µs per JSONL record
on one core, while the other cores idle (a warm session's 1M-event build spent 3 s of its 7.5 s
there; docs/benchmarks.md, "The driver parses on every core"). So a run of at least
``PARALLEL_PARSE_BYTES`` is cut into pieces that a pool of worker processes parses at once:

- a JSONL file larger than ``PIECE_BYTES`` is cut at line ends (a JSON Lines record never spans
  lines, and the parser reads a file line by line: ``records.jsonl.jsonl_lines``);
- any other file is one piece (a quoted CSV field may hold a line break).

A worker sends back its piece's ``PARSED_SCHEMA`` batches as one Arrow IPC stream, without the
text of valid records (``order.rejected_raw``: the run drops it anyway), and the number of
lines in the piece. The caller renumbers a piece's lines after those of the file's earlier
pieces (``WorkerRun.files``), so a file's batches are the rows its parse in one process
gives, in the same order (tests/ingest/test_parse_workers.py).

The pool lives as long as the process: a resident driver's (``versiq driver``) later runs find
its workers started. Its processes are forked by a fork server, a fresh interpreter that has
imported this module, never from the driver itself, which holds the JVM gateway's threads and
DuckDB's. A worker that dies (killed, out of memory) breaks the pool, and a pool may fail to
start (a process limit, no file handles left): either way the caller parses in its own process
instead (``parse.parse_here``), and the next run starts another pool. An error a worker raises
is the run's error (an OSError names the file; any other comes back as text). As with every
``multiprocessing`` start method but fork, each worker imports the main module of the process
that started the pool (under another name): a script that runs an ingest in its own process
keeps its work under ``if __name__ == "__main__":``.
"""

from __future__ import annotations

import gc
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import traceback
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from versiq import settings
from versiq.ingest.order import rejected_raw
from versiq.ingest.records import PARSED_SCHEMA, format_of, parse_file
from versiq.ingest.records.jsonl import Span
from versiq.ingest.sources import read_error

#: New input (bytes of a run's files) from which a run parsed in the driver is parsed by worker
#: processes: about 200k JSONL records, half a second of one core. Below it the pool's start
#: (0.35 s for the first run of a process) and the transfer of the batches would cost more than
#: the second core saves, and a small run's files are parsed while Spark starts anyway.
PARALLEL_PARSE_BYTES = 16 << 20

#: The size a JSONL file is cut into pieces of: several per worker, so that one slow piece does
#: not keep the others waiting, each a few MB of Arrow to send back.
PIECE_BYTES = 8 << 20

#: Overrides the number of worker processes (1: the driver parses every run itself).
PARSE_WORKERS_ENV = settings.PARSE_WORKERS.name

_RAW = PARSED_SCHEMA.get_field_index("raw")
_POS = PARSED_SCHEMA.get_field_index("pos")


@dataclass(frozen=True)
class Piece:
    """Whole lines of one of a run's files (``path``, absolute): bytes ``span`` of it, or the
    whole file (None)."""

    file_index: int
    path: str
    source: str
    fmt: str
    span: Span | None


def parse_workers() -> int:
    """How many worker processes parse a large run: ``VERSIQ_PARSE_WORKERS``, else one per core
    this process may run on, within its cgroup's CPU quota (a container's ``--cpus``)."""
    explicit = settings.PARSE_WORKERS.value()
    if explicit is not None:
        return explicit
    cores = len(os.sched_getaffinity(0))
    quota = cpu_quota()
    return cores if quota is None else max(1, min(cores, quota))


def cpu_quota(path: str = "/sys/fs/cgroup/cpu.max") -> int | None:
    """Whole cores the cgroup (v2) of this process may use, rounded down, or None (no limit, no
    cgroup v2): ``sched_getaffinity`` counts the host's cores inside a container limited by CPU
    time, and a pool of that many would share a few cores' time."""
    try:
        with open(path) as handle:
            quota, period = handle.read().split()[:2]
        return None if quota == "max" else int(quota) // int(period)
    except (OSError, ValueError):
        return None


def plan_pieces(files: dict[str, str], fmt: str | None, workers: int,
                piece_bytes: int | None = None) -> list[Piece] | None:
    """The pieces the run's ``files`` (relative path -> local path, in order) are parsed in, or
    None when the run is parsed in one process: fewer than two ``workers``, less input than
    ``PARALLEL_PARSE_BYTES``, or a single piece. A file the OS refuses: ``sources.read_error``."""
    if workers < 2:
        return None
    piece_bytes = piece_bytes or PIECE_BYTES
    pieces: list[Piece] = []
    total = 0
    for index, (rel, path) in enumerate(files.items()):
        file_fmt = format_of(rel, fmt)
        full = os.path.abspath(path)  # the workers keep the directory they started in (a driver changes its)
        try:
            size = os.path.getsize(full)
            starts = line_starts(full, piece_bytes) if file_fmt == "jsonl" and size > piece_bytes else [0]
        except OSError as exc:
            raise read_error(path, exc) from None
        total += size
        if len(starts) == 1:
            pieces.append(Piece(index, full, rel, file_fmt, None))
        else:
            ends: list[int | None] = [*starts[1:], None]  # the last piece reads to the end of the file
            pieces += [Piece(index, full, rel, file_fmt, (start, end)) for start, end in zip(starts, ends, strict=True)]
    return pieces if total >= PARALLEL_PARSE_BYTES and len(pieces) > 1 else None


def line_starts(path: str, piece_bytes: int) -> list[int]:
    """Where a file's pieces start: 0, then the first line start at or after each
    ``piece_bytes`` past the previous piece's start (a line longer than that is in one piece)."""
    starts = [0]
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        target = piece_bytes
        while target < size:
            handle.seek(target - 1)
            at = target - 1
            while True:
                block = handle.read(1 << 16)
                if not block:
                    return starts
                found = block.find(b"\n")
                if found >= 0:
                    at += found + 1
                    break
                at += len(block)
            if at >= size:
                break
            starts.append(at)
            target = at + piece_bytes
    return starts


class WorkerRun:
    """A run's pieces handed to the pool (``start``): their batches file by file (``files``).
    Leaving its ``with`` block drops the pieces not yet started (the caller stopped early: too
    many records, an error, Ctrl-C), and stops the pool if it broke (``BrokenProcessPool``)."""

    def __init__(self, pool: ProcessPoolExecutor, pieces: list[Piece],
                 futures: list[Future[tuple[pa.Buffer, int]]]) -> None:
        self.pool, self.pieces, self.futures = pool, pieces, futures

    @classmethod
    def start(cls, pieces: list[Piece], max_timestamp: int | None, workers: int) -> WorkerRun:
        """Submit every piece to the pool of ``workers``. Whatever keeps the pool from starting
        its processes (a process limit, no file handles left, a dead fork server) is raised as
        ``BrokenProcessPool``, as a worker's death is: the caller parses in its own process."""
        pool: ProcessPoolExecutor | None = None
        futures: list[Future[tuple[pa.Buffer, int]]] = []
        try:
            pool = _executor(workers)
            for piece in pieces:
                futures.append(pool.submit(_parse_piece, piece, max_timestamp))
        except Exception as exc:
            for future in futures:
                future.cancel()
            if pool is not None:
                stop_pool(pool, wait=False)
            if isinstance(exc, BrokenProcessPool):
                raise
            raise BrokenProcessPool(f"the parse workers could not start ({exc})") from exc
        return cls(pool, pieces, futures)

    def files(self) -> Iterator[tuple[int, Iterator[pa.RecordBatch]]]:
        """(file index, that file's ``PARSED_SCHEMA`` batches in file order) for each file of
        the run, in order; consume each file's batches before the next file's. A piece's OSError
        is raised while its file's batches are read; a dead worker raises ``BrokenProcessPool``."""
        by_file: dict[int, list[Future[tuple[pa.Buffer, int]]]] = {}
        for piece, future in zip(self.pieces, self.futures, strict=True):
            by_file.setdefault(piece.file_index, []).append(future)
        for index, file_futures in by_file.items():
            yield index, _renumbered(file_futures)

    def __enter__(self) -> WorkerRun:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        for future in self.futures:
            future.cancel()
        if isinstance(exc, BrokenProcessPool):
            stop_pool(self.pool, wait=False)


def _renumbered(futures: list[Future[tuple[pa.Buffer, int]]]) -> Iterator[pa.RecordBatch]:
    lines_before = 0
    for future in futures:
        data, lines = future.result()
        for batch in pa.ipc.open_stream(data):
            if lines_before:
                batch = batch.set_column(_POS, PARSED_SCHEMA.field(_POS),
                                         pc.add(batch.column(_POS), pa.scalar(lines_before, pa.int64())))
            yield batch
        lines_before += lines


def _parse_piece(piece: Piece, max_timestamp: int | None) -> tuple[pa.Buffer, int]:
    """In a worker: the piece's batches (lines numbered from 1 at its start) and its number of
    lines (0 for a piece that ends the file: nothing is numbered after it)."""
    try:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, PARSED_SCHEMA) as writer:
            for batch in parse_file(piece.path, piece.source, piece.fmt, max_timestamp, piece.span):
                writer.write_batch(batch.set_column(_RAW, PARSED_SCHEMA.field(_RAW), rejected_raw(batch)))
        return sink.getvalue(), _lines(piece)
    except OSError:  # the run's error, naming the file (``parse._ordered``)
        raise
    except Exception as exc:  # sent back as text: not every exception survives pickling
        raise RuntimeError(f"parsing {piece.source} (bytes {piece.span or 'all'}): {type(exc).__name__}: {exc}\n"
                           f"{traceback.format_exc()}") from None


def _lines(piece: Piece) -> int:
    start, end = piece.span or (0, None)
    if end is None:
        return 0
    count = 0
    with open(piece.path, "rb") as handle:
        handle.seek(start)
        left = end - start
        while left > 0:
            block = handle.read(min(left, 1 << 20))
            if not block:
                break
            count += block.count(b"\n")
            left -= len(block)
    return count


_pool: ProcessPoolExecutor | None = None
_pool_workers = 0
_pool_lock = threading.Lock()


def _executor(workers: int) -> ProcessPoolExecutor:
    global _pool, _pool_workers
    with _pool_lock:
        if _pool is None or _pool_workers != workers:
            if _pool is not None:  # another run may still be using it: it ends once that is done
                _pool.shutdown(wait=False)
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload([__name__])
            _pool = ProcessPoolExecutor(workers, mp_context=context, initializer=_worker_started)
            _pool_workers = workers
        return _pool


def stop_pool(pool: ProcessPoolExecutor | None = None, wait: bool = True) -> None:
    """Stop ``pool`` (by default the current one); the next large run starts another. ``wait``:
    until its workers have ended, then release its semaphores too: a process that ends without
    exit handlers (the CLI, ``cli.main.run``) would leave them to ``multiprocessing``'s resource
    tracker, which warns of them as leaked. Not ``wait``: the pool broke (``WorkerRun``)."""
    global _pool
    with _pool_lock:
        if pool is None:
            pool = _pool
        if pool is _pool:
            _pool = None
    if pool is not None:
        pool.shutdown(wait=wait, cancel_futures=True)
        del pool
        if wait:
            gc.collect()


def _worker_started() -> None:
    """In each worker, once. Ctrl-C reaches the whole process group: the driver stops the run,
    its workers need not print a traceback each. A worker ends with the process that started
    the pool, however that ends: ``concurrent.futures`` stops its workers only from an exit
    handler, and the CLI ends without them (``cli.main.run``), as a killed process does; its
    workers would wait for work forever, holding its stdout open."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.chdir("/")  # pieces name absolute paths; hold no directory the driver's callers may remove
    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(target=_end_with, args=(parent.sentinel,), name="versiq-parse-parent", daemon=True).start()


def _end_with(sentinel: int) -> None:
    multiprocessing.connection.wait([sentinel])
    os._exit(0)
