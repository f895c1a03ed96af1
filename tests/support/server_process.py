"""A server the tests run as a real process on 127.0.0.1 (the Kafka broker, the S3 server): its
life cycle, once. Start, wait until it answers, stop cleanly or kill it, restart it on the same
ports with the same data, and never leave it behind: the process and the temporary directory go
when the object is closed, garbage-collected, or at interpreter exit (``weakref.finalize``), and a
process started from the main thread dies with the test run even when that is SIGKILLed.

A subclass says what to run (``command``, ``environment``), what to do before the first start
(``_prepare``) and when the server is ready (``_wait_ready``); every error it raises through
``_error`` carries the tail of the server's log file.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

# Ports for the servers the tests start come from below the kernel's ephemeral range (32768-60999
# by default, /proc/sys/net/ipv4/ip_local_port_range), which the kernel hands to outgoing
# connections: a port taken from there, released and handed to a server a moment later can be
# taken meanwhile as the local end of any connection on the machine (CI saw `weed mini` refuse
# one). Each pytest-xdist worker takes its own slice, so two workers never pick the same port, and
# a process hands out each port once per pass through its slice.
_PORT_FLOOR, _PORT_CEILING = 20000, 32768
_next_port: int | None = None  # where this process's next pass through its slice goes on
_port_lock = threading.Lock()


def _port_slice() -> range:
    """This process's slice of [_PORT_FLOOR, _PORT_CEILING): the whole range, or the
    ``PYTEST_XDIST_WORKER``'s (``gwN``) share of it."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    width = (_PORT_CEILING - _PORT_FLOOR) // max(count, 1)
    start = _PORT_FLOOR + (index % max(count, 1)) * width
    return range(start, start + width)


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports on 127.0.0.1 that nobody listens on, from this process's slice (see
    above), each one checked by binding it; all are released before they are returned."""
    global _next_port
    ports = _port_slice()
    chosen: list[int] = []
    with _port_lock:
        cursor = ports.start + os.getpid() % len(ports) if _next_port is None else _next_port
        for _ in range(len(ports)):
            port = ports[(cursor - ports.start) % len(ports)]
            cursor += 1
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    continue
            chosen.append(port)
            if len(chosen) == count:
                break
        _next_port = cursor
    if len(chosen) < count:
        raise RuntimeError(f"no {count} free ports in {ports.start}-{ports.stop - 1}")
    return chosen


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the thread that started it goes (PR_SET_PDEATHSIG), so a
    test run that is itself killed leaves no server behind."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)


def _clean_up(leftovers: dict[str, Any]) -> None:
    """Kill a server's process, run its ``on_exit`` and remove its temporary directory
    (``weakref.finalize``: when the object is closed or garbage-collected, or at interpreter exit)."""
    process = leftovers.get("process")
    if process is not None and process.poll() is None:
        with contextlib.suppress(Exception):
            process.kill()
            process.wait(10)
    leftovers["process"] = None
    if leftovers.get("on_exit") is not None:
        leftovers["on_exit"]()
    if leftovers.get("dir"):
        shutil.rmtree(leftovers["dir"], ignore_errors=True)
        leftovers["dir"] = None


class ServerProcess:
    """One server process of the tests (module docstring). Subclasses set the class attributes
    and implement ``command`` and ``_wait_ready``."""

    #: The exception every failure raises (with the log's tail).
    error: type[RuntimeError] = RuntimeError
    #: How logs and errors name the server ("the Kafka broker exited ...").
    what = "server"
    start_timeout = 60.0
    stop_timeout = 20.0

    def __init__(self, work_dir: Path | str | None, *, dir_prefix: str, log_name: str,
                 on_exit: Callable[[], None] | None = None, new_session: bool = False) -> None:
        """``work_dir``: where data and log live (None: a temporary directory removed on close);
        ``on_exit``: run whenever the process is gone (it must not refer to this object);
        ``new_session``: the process leads a session of its own, so that a Ctrl-C in the terminal
        reaches only the program that started it, which stops it when it chooses (make demo-kafka:
        the broker after the ingest that reads from it)."""
        self.new_session = new_session
        if work_dir is None:
            self._owned_dir: str | None = tempfile.mkdtemp(prefix=dir_prefix)
            self.work_dir = Path(self._owned_dir)
        else:
            self._owned_dir = None
            self.work_dir = Path(work_dir)
            self.work_dir.mkdir(parents=True, exist_ok=True)
        self.log_file = self.work_dir / log_name
        self.startup_seconds: float | None = None  # how long the last start() took
        # What must go when this object does, whatever happened to the tests.
        self._leftovers: dict[str, Any] = {"process": None, "dir": self._owned_dir, "on_exit": on_exit}
        self._finalizer = weakref.finalize(self, _clean_up, self._leftovers)
        self._lock = threading.RLock()
        self._closed = False

    # -- what subclasses say ---------------------------------------------------------------------

    def command(self) -> list[str]:
        raise NotImplementedError

    def environment(self) -> dict[str, str] | None:
        """The process's environment (None: this process's)."""
        return None

    def _prepare(self, timeout: float) -> None:
        """Before each start (configuration files, a storage format on the first one)."""

    def _wait_ready(self, deadline: float) -> None:
        raise NotImplementedError

    # -- the process -----------------------------------------------------------------------------

    @property
    def _process(self) -> subprocess.Popen[bytes] | None:
        process: subprocess.Popen[bytes] | None = self._leftovers["process"]
        return process

    @_process.setter
    def _process(self, process: subprocess.Popen[bytes] | None) -> None:
        self._leftovers["process"] = process
        if process is None and self._leftovers["on_exit"] is not None:
            self._leftovers["on_exit"]()

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def is_running(self) -> bool:
        """Whether the process is alive (not whether it answers yet)."""
        return self._process is not None and self._process.poll() is None

    def _exited_error(self) -> RuntimeError:
        code = self._process.returncode if self._process is not None else None
        return self._error(f"the {self.what} exited while starting (exit {code})")

    def start(self, timeout: float | None = None) -> Self:
        """Start the server and wait until it is ready; ``error`` with the log's tail when it dies or
        is not ready within ``timeout`` seconds (default ``start_timeout``)."""
        timeout = self.start_timeout if timeout is None else timeout
        with self._lock:
            if self._closed:
                raise self.error(f"this {type(self).__name__} was closed")
            if self.is_running():
                return self
            began = time.monotonic()
            self._prepare(timeout)
            log = open(self.log_file, "ab")  # handed to the child, closed here once it has it
            try:
                log.write(f"\n==== starting the {self.what} at {time.strftime('%H:%M:%S')} ====\n".encode())
                log.flush()
                self._process = subprocess.Popen(
                    self.command(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    cwd=self.work_dir, env=self.environment(), start_new_session=self.new_session,
                    # Only from the main thread: the signal comes when the starting *thread* ends.
                    preexec_fn=_die_with_parent if threading.current_thread() is threading.main_thread() else None,
                )
            finally:
                log.close()
            try:
                self._wait_ready(began + timeout)
            except BaseException:
                self.kill()
                raise
            self.startup_seconds = time.monotonic() - began
            return self

    def ensure_running(self, timeout: float | None = None) -> Self:
        """``start()`` unless the server is running: for a test after one that stopped it and failed."""
        return self.start(timeout)

    def stop(self, timeout: float | None = None) -> None:
        """Shut the server down cleanly (SIGTERM), or SIGKILL it after ``timeout`` seconds."""
        with self._lock:
            process = self._process
            if process is None:
                return
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(self.stop_timeout if timeout is None else timeout)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(10)
            self._process = None

    def kill(self) -> None:
        """SIGKILL the server (a crash: what it acknowledged is there after the next start)."""
        with self._lock:
            process = self._process
            if process is None:
                return
            if process.poll() is None:
                process.kill()
                process.wait(10)
            self._process = None

    def restart(self, timeout: float | None = None, *, hard: bool = False) -> Self:
        """Stop the server (``kill()`` when ``hard``) and start it again on the same ports with the
        same data: what it stored survives."""
        with self._lock:
            if hard:
                self.kill()
            else:
                self.stop()
            return self.start(timeout)

    def close(self) -> None:
        """Stop the server and remove its temporary directory (when this object made it)."""
        with self._lock:
            try:
                self.stop()
            finally:
                self._closed = True
                self._finalizer()  # kills a leftover process, removes the temporary directory

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the server's log file."""
        try:
            with open(self.log_file, "rb") as handle:
                handle.seek(0, os.SEEK_END)
                handle.seek(max(0, handle.tell() - 64 * 1024))
                text = handle.read().decode("utf-8", "replace")
        except OSError:
            return f"(no {self.what} log)"
        return "\n".join(text.splitlines()[-lines:])

    def _error(self, message: str) -> RuntimeError:
        return self.error(f"{message}\n--- last lines of {self.log_file} ---\n{self.log_tail()}")
