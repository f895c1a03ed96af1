"""The resident driver: one warm Spark session that runs ``versiq ingest`` for the CLI, so that
small runs are cheap.

A one-shot ``versiq ingest`` pays for a cold JVM on every run: Spark's start, class loading and
the first compilation of every code path, about 11 of a one-record run's 12 s and 14 of the 18 s
of 10k events into a store of 2M versions; the same run in a warm session takes about 4 s
(docs/benchmarks.md). ``versiq driver`` starts a session once, warms it up with a few runs into a
scratch warehouse, and listens on a Unix socket; ``versiq ingest`` (batch mode) hands its
arguments to the driver when one listens there (``forward``) and prints what the run prints, with
the run's exit status. Without a driver, or when the driver cannot run the request as this
process would, the CLI runs in its own process as before: the driver is a cache of a warm JVM,
never a second source of behaviour.

What makes the driver's run the same as the CLI's own:

- **The same code and settings.** A request carries the interpreter, the versiq package's files
  (path, size, modification time), the versions of the libraries a run uses, the umask (the
  driver's JVM writes files with its own), and a digest of every environment variable that
  shapes a run (``VERSIQ_*``, ``AWS_*``, ``SPARK_*``, ``PYSPARK_*``, ``HADOOP_*``, ``JAVA_*``,
  ``TZ``, ``TMPDIR``, ``HOME``; not the log settings, which the request's arguments carry). The
  driver refuses a request whose values differ from its own at start, and the CLI runs it
  itself (logged at INFO): an upgraded checkout or another bucket's credentials never run in a
  stale session.
- **The same arguments.** The driver parses the request's argv with the CLI's own parser, in the
  request's working directory (relative paths mean what they meant to the caller), and runs
  ``commands.ingest_command`` with its session. ``--continuous``, and a master other than the
  driver's, run in their own process.
- **One run at a time, never a wait the CLI would not have.** A session's settings change per
  run (``spark.plans_for_input``), so the driver runs one request at a time; a request that
  arrives while it is busy is refused and runs in its own process, as it would have without a
  driver (concurrent runs, each store's writer lock and ``--lock-timeout`` as before).
- **Crash safety is the run's.** A run is one atomic, idempotent commit per store, so a driver
  killed during a run leaves what a killed CLI run leaves. The CLI then runs the request itself.
  When the caller goes away (Ctrl-C), the driver cancels the run's Spark jobs until it ends: a
  run stops at its next job, and one whose commit had begun commits whole or not at all.

What stays the driver's: Spark's own log (``--log-level DEBUG``) and Python warnings shown once
per process go to the driver's standard error, not the caller's.

The socket is ``VERSIQ_DRIVER_SOCKET`` (``off``: never use a driver), by default
``$XDG_RUNTIME_DIR/versiq/driver.sock`` (else under ``~/.cache/versiq``). It is made under a
temporary name and renamed into place once the driver is ready (a caller never waits for a
driver's start), with mode 0600; the CLI uses a driver only when the process listening runs as
its own user (``SO_PEERCRED``). One driver per path: each holds ``<path>.lock`` locked from
before its JVM starts (``claim``); the folder must be the user's alone and the lock file a
regular file of the user, never opened through a link. ``--stop`` signals the pid the lock file
names only when that process listens on the socket, or its temporary name, as this user
(``serving_problem``). The driver ends after ``--idle-timeout`` without a run, on
SIGTERM or SIGINT (after the run in progress), and removes its socket if it is still its own.
With ``VERSIQ_DRIVER_AUTOSTART`` a CLI run that starts Spark starts a driver for the runs after
it (``driver_client.autostart_hook``; ``--after-pid``: Spark starts once that run has ended).

Protocol (one JSON object per line, UTF-8): the client sends one request ``{"argv", "cwd",
"env", "umask", "code"}``; the driver answers ``{"refused": reason}``, or any number of
``{"out": text}`` and ``{"err": text}`` followed by ``{"exit": status}``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import io
import json
import logging
import os
import select
import signal
import socket
import stat
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from typing import IO, Any

from versiq.exits import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from versiq.ingest.commands import ingest_command
from versiq.ingest.driver_client import (
    CONNECT_TIMEOUT_S,
    OFF,
    SOCKET_ENV,
    ByteStream,
    code_identity,
    current_umask,
    driver_pid,
    folder_problem,
    lock_path,
    open_own_file,
    peer_credentials,
    run_environment,
    send,
    socket_path,
)
from versiq.ingest.warm_up import warm_up
from versiq.logs import setup_logging

log = logging.getLogger("versiq.ingest")

#: The longest path of a Unix socket (``sun_path`` is 108 bytes on Linux, with its NUL).
MAX_SOCKET_PATH = 107
#: Tries to take a socket path's lock, 50 ms apart: a driver holds it for its whole life, a
#: client's probe for an instant.
CLAIM_ATTEMPTS = 10
#: The largest request line read (argv, cwd, environment digests: a few KB in practice).
MAX_REQUEST_BYTES = 1 << 20
#: Tries, 0.1 s apart, of ``--stop`` to find the socket of the driver the lock file names.
VERIFY_ATTEMPTS = 10
#: How long the driver waits on a client's socket (its request, or room for output) before it
#: takes the client as gone.
CLIENT_TIMEOUT_S = 60.0

# --------------------------------------------------------------------------------------------
# The driver: ``versiq driver``.


class _Output(io.TextIOBase):
    """A text stream whose writes go to the client as ``{key: text}`` messages; a client that
    has gone away makes writes no-ops (``gone``)."""

    def __init__(self, stream: ByteStream, key: str, lock: threading.Lock, gone: threading.Event) -> None:
        self._stream, self._key, self._lock, self._gone = stream, key, lock, gone

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if text and not self._gone.is_set():
            with self._lock:
                try:
                    send(self._stream, {self._key: text})
                except OSError:
                    self._gone.set()
        return len(text)


class Driver:
    """A warm session serving ``versiq ingest`` requests on a Unix socket (see the module
    docstring). ``parse(argv)`` is the CLI's argument parser (passed down: the CLI is above)."""

    def __init__(self, spark: Any, master: str, parse: Callable[[list[str]], argparse.Namespace]) -> None:
        self.spark = spark
        self.master = master
        self.parse = parse
        self.environment = run_environment(os.environ)
        self.umask = current_umask()
        self.code = code_identity()
        self.run_lock = threading.Lock()
        self.last_run = time.monotonic()
        self.stopping = threading.Event()
        #: The driver's own standard error (a run's goes to its client).
        self.own_stderr = sys.stderr
        #: Started by a run (``--after-pid``): end at the first request of other code (an upgraded
        #: or edited checkout), so that the next run starts a driver of its own code.
        self.end_when_outdated = False

    def refusal(self, request: Mapping[str, Any]) -> str | None:
        """Why this driver does not run ``request`` as its caller would (None: it does)."""
        if request.get("code") != self.code:
            return f"it runs other code ({self.code}; the request: {request.get('code')})"
        theirs = request.get("env")
        if not isinstance(theirs, dict):
            return "the request has no environment"
        differ = sorted(name for name in set(theirs) | set(self.environment)
                        if theirs.get(name) != self.environment.get(name))
        if differ:
            return f"its environment differs in {', '.join(differ)}"
        if request.get("umask") != self.umask:
            return f"its umask is {self.umask:03o}"
        return None

    def handle(self, conn: socket.socket) -> None:
        """One client: check, take the run lock (or refuse: busy), parse, run, answer. Nothing
        here may raise into the thread: its traceback would go to a running request's stderr."""
        try:
            conn.settimeout(CLIENT_TIMEOUT_S)  # a caller that stops reading (Ctrl-Z) is gone
            with conn:
                stream = conn.makefile("rwb")
                try:
                    self._handle(conn, stream)
                finally:
                    with contextlib.suppress(OSError):  # flushing to a caller that went away
                        stream.close()
        except Exception:  # noqa: BLE001 - one bad client never stops the driver
            self._note("ERROR", f"a request failed:\n{traceback.format_exc()}")

    def _handle(self, conn: socket.socket, stream: Any) -> None:
        try:
            line = stream.readline(MAX_REQUEST_BYTES)
            if not line:  # a probe (``--stop``, ``--status``, a run's autostart) that sent nothing: no request
                return
            request = json.loads(line)
        except (ValueError, OSError):
            return
        reason = self.refusal(request) if isinstance(request, dict) else "the request is not an object"
        if reason is None and not self.run_lock.acquire(blocking=False):
            reason = "it is busy with another run"
        if reason is not None:
            with contextlib.suppress(OSError):
                send(stream, {"refused": reason})
            if self.end_when_outdated and isinstance(request, dict) and request.get("code") != self.code:
                self._note("INFO", "a client runs other code than this driver, which a run started for its "
                                   "own code (--after-pid): stopping, the next run starts a driver for its code")
                self.stopping.set()
            return
        gone = threading.Event()
        try:  # parsing redirects stderr too: only under the run lock
            if self.stopping.is_set():
                code: int | str = "it is stopping"
            else:
                code = self._run(conn, stream, request, gone)
            with contextlib.suppress(OSError):
                send(stream, {"exit": code} if isinstance(code, int) else {"refused": code})
        finally:
            self.last_run = time.monotonic()
            self.run_lock.release()
        if gone.is_set():
            self._note("INFO", f"the run of the caller that went away has ended (status {code})")

    def _note(self, level: str, message: str) -> None:
        """A line of the driver's own log, in the text log's format: while a run goes on, the
        logging handlers write to that run's caller."""
        print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {level} versiq.ingest: {message}", file=self.own_stderr,
              flush=True)

    def _run(self, conn: socket.socket, stream: Any, request: Mapping[str, Any], gone: threading.Event) -> int | str:
        """The request's exit status, or why it is refused. Everything happens in the caller's
        working directory: parsing makes ``--warehouse`` absolute, the run resolves sources."""
        here = os.getcwd()
        try:
            os.chdir(str(request.get("cwd") or "/"))
        except OSError as exc:
            return f"cannot enter the caller's working directory ({exc})"
        try:
            return self._parsed_run(conn, stream, request, gone)
        finally:
            os.chdir(here)

    def _parsed_run(self, conn: socket.socket, stream: Any, request: Mapping[str, Any],
                    gone: threading.Event) -> int | str:
        from versiq.ingest.spark import master_url

        try:
            with contextlib.redirect_stderr(io.StringIO()):  # argparse's own messages
                args = self.parse([str(a) for a in request.get("argv") or ()])
        except SystemExit:
            return "the arguments do not parse here"
        if args.command != "ingest" or args.continuous:
            return "it runs batch ingests only"
        if master_url(args.master) != self.master:  # the caller's --master, else SPARK_MASTER or local[*]
            return f"it runs on master {self.master}"
        lock, done = threading.Lock(), threading.Event()
        out, err = _Output(stream, "out", lock, gone), _Output(stream, "err", lock, gone)
        watcher = threading.Thread(target=self._cancel_when_gone, args=(conn, gone, done), daemon=True,
                                   name="versiq-driver-client")
        watcher.start()
        try:
            return self._ingest(args, out, err)
        finally:
            done.set()
            watcher.join()  # no cancellation of this run may reach the next one

    def _ingest(self, args: argparse.Namespace, out: io.TextIOBase, err: io.TextIOBase) -> int:
        """``ingest_command`` with this session, its output and logs to the client."""
        from versiq.ingest.spark import active_on_this_thread

        root = logging.getLogger()
        handlers, level = root.handlers[:], root.level
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                setup_logging(args.log_format, args.log_level)  # onto the redirected stderr
                log.debug("running in the resident driver (pid %d)", os.getpid())
                try:
                    with active_on_this_thread(self.spark):  # a request's thread is new to the JVM
                        return ingest_command(args, spark=self.spark)
                except Exception:  # noqa: BLE001 - as the CLI process would: a traceback, status 1
                    err.write(traceback.format_exc())
                    return EXIT_FAILED
        finally:
            root.handlers[:] = handlers
            root.setLevel(level)

    def _cancel_when_gone(self, conn: socket.socket, gone: threading.Event, done: threading.Event) -> None:
        """Watch the client's side of the socket; once it closed (or stopped reading) before the
        run ended, cancel the session's jobs until the run ends (it stops at its next job)."""
        with contextlib.suppress(OSError):
            while not done.is_set() and not gone.is_set():
                if _readable(conn, 0.2) and conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":
                    gone.set()
        if not gone.is_set() or done.is_set():
            return
        self._note("WARNING", "the caller went away: cancelling the run's Spark jobs until it ends")
        while not done.is_set():
            with contextlib.suppress(Exception):
                self.spark.sparkContext.cancelAllJobs()
            done.wait(0.2)


def _readable(conn: socket.socket, timeout_s: float) -> bool:
    ready, _, _ = select.select([conn], [], [], timeout_s)
    return bool(ready)


def check_free(path: str) -> None:
    """Raise ``OSError`` unless a driver may listen at ``path``: a path short enough, and no
    live driver there. A socket nobody listens on (left by a driver that was killed) is removed;
    any other kind of file is left alone and refused."""
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise OSError(f"socket path {path!r} is longer than {MAX_SOCKET_PATH} bytes")
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise OSError(f"{path} exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        os.unlink(path)
    else:
        raise OSError(f"a driver already listens on {path}")
    finally:
        probe.close()


def claim(path: str) -> IO[bytes]:
    """Hold ``<path>.lock`` (``lock_path``) for the driver's whole life: one driver per socket
    path, decided before its JVM starts, even when two start at the same moment (two CLIs that
    each start one, ``VERSIQ_DRIVER_AUTOSTART``). The kernel releases the lock when the process
    ends, however it ends; the caller closes the returned file at exit. Staging sockets that
    drivers killed while starting left beside ``path`` are removed (``_remove_dead_staging``).

    Raises ``OSError`` when another driver holds the lock, when the socket's folder is not this
    user's alone (``folder_problem``: every driver, started by hand or by a run), or when the
    lock file is not a regular file of this user (never through a link: ``open_own_file``), so
    that no one else's file is ever truncated or named as this driver."""
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise OSError(f"socket path {path!r} is longer than {MAX_SOCKET_PATH} bytes")
    folder = os.path.dirname(path)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    problem = folder_problem(folder)
    if problem is not None:
        raise OSError(problem)
    handle = os.fdopen(open_own_file(lock_path(path), os.O_RDWR | os.O_CREAT), "r+b")
    try:
        _lock(handle, path)
        handle.truncate(0)
        handle.write(f"{os.getpid()}\n".encode())  # for --status and --stop (driver_client.driver_pid)
        handle.flush()
    except BaseException:
        handle.close()
        raise
    _remove_dead_staging(path)
    return handle


def _lock(handle: IO[bytes], path: str) -> None:
    """Take ``handle``'s exclusive lock, retrying a while: a probe (``driver_client.driver_pid``)
    holds it for microseconds. Raises ``OSError`` when another driver holds it."""
    for attempt in range(CLAIM_ATTEMPTS):
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if attempt == CLAIM_ATTEMPTS - 1:
                raise OSError(f"another driver is starting or running on {path}") from None
            time.sleep(0.05)


def _remove_dead_staging(path: str) -> None:
    """Remove the staging sockets (``<path>.<pid>``) that nobody listens on: those of drivers
    killed while starting (``kill -9``, out of memory). The caller holds the path's lock, so no
    other driver is starting there; anything else (a live socket, another kind of file) stays."""
    folder, prefix = os.path.dirname(path), os.path.basename(path) + "."
    for name in os.listdir(folder):
        if name.startswith(prefix) and name[len(prefix):].isdigit():
            with contextlib.suppress(OSError):
                check_free(os.path.join(folder, name))


@contextlib.contextmanager
def staged(path: str) -> Iterator[socket.socket]:
    """A listening socket (mode 0600) under a temporary name beside ``path`` (``<path>.<pid>``)
    while the block runs: ``publish`` renames it into place once the driver is ready. However the
    block ends (an error while starting, a signal, the end of serving), the socket is closed and
    the temporary name removed. The caller holds ``claim(path)``. Bound before the JVM starts
    (and before ``--after-pid``'s wait), so that ``--stop`` can check, from the claim on, which
    process serves the path (``serving_problem``)."""
    check_free(path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        old = os.umask(0o177)  # the socket: this user only
        try:
            server.bind(_staging(path))
        finally:
            os.umask(old)
        try:
            server.listen(16)
            yield server
        finally:
            with contextlib.suppress(OSError):
                os.unlink(_staging(path))
    finally:
        server.close()


def _staging(path: str, pid: int | None = None) -> str:
    """The temporary name of the socket of the driver ``pid`` (default: this process)."""
    return f"{path}.{os.getpid() if pid is None else pid}"


def publish(path: str) -> tuple[int, int]:
    """Rename the driver's socket into place (after checking again that no driver took the
    path meanwhile); returns its (device, inode), which the driver checks before removing it."""
    check_free(path)
    os.rename(_staging(path), path)
    info = os.lstat(path)
    return info.st_dev, info.st_ino


def unpublish(path: str, identity: tuple[int, int] | None) -> None:
    """Remove the driver's socket at ``path`` while it is still this one (``publish``)."""
    with contextlib.suppress(OSError):
        info = os.lstat(path)
        if identity == (info.st_dev, info.st_ino):
            os.unlink(path)


def serving_problem(path: str, pid: int) -> str | None:
    """Why process ``pid`` (the one ``<path>.lock`` names) is not known to be this user's driver
    on ``path``; None when it is: the process listening on ``path``, or on the staging name of
    ``pid`` while that driver starts, is ``pid`` and runs as this user (``SO_PEERCRED``). A
    number in a file is no ground for a signal: the lock could be held by a process that
    inherited it, or the file written by someone else. Looks for up to ``VERIFY_ATTEMPTS`` tenths
    of a second: a driver binds its staging name just after it claims the path."""
    for attempt in range(VERIFY_ATTEMPTS):
        seen = [(where, creds) for where in (path, _staging(path, pid)) if (creds := _listener(where))]
        if any(creds == (pid, os.getuid()) for _, creds in seen):
            return None
        if seen:
            where, (other, uid) = seen[0]
            return f"the process listening on {where} is pid {other} of user {uid}"
        if attempt < VERIFY_ATTEMPTS - 1:
            time.sleep(0.1)
    return f"no process listens on {path} or {_staging(path, pid)}"


def _listener(path: str) -> tuple[int, int] | None:
    """The (pid, user id) of the process listening on the Unix socket ``path``; None when none."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(CONNECT_TIMEOUT_S)
        probe.connect(path)
        return peer_credentials(probe)
    except OSError:
        return None
    finally:
        probe.close()


@contextlib.contextmanager
def _stop_on_signals(stopping: threading.Event) -> Iterator[None]:
    previous = {sig: signal.signal(sig, lambda *_: stopping.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def driver_command(args: argparse.Namespace, parse: Callable[[list[str]], argparse.Namespace]) -> int:
    """``versiq driver``: claim the path, listen under the staging name, start a session, warm it
    up, serve requests until idle or signalled. Whatever ends it, the staging name and the
    published socket (while its own) are removed, and the lock is released."""
    from versiq.durations import DurationError, parse_duration_ms

    path = os.path.abspath(args.socket) if args.socket else socket_path()
    if path is None:
        print(f"versiq driver: error: {SOCKET_ENV} is {OFF}: give --socket", file=sys.stderr)
        return EXIT_USAGE
    if args.status or args.stop:
        return _status(path, stop=args.stop)
    try:
        idle_s = parse_duration_ms(args.idle_timeout) / 1000
    except DurationError as exc:
        print(f"versiq driver: error: --idle-timeout: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        held = claim(path)
    except OSError as exc:
        print(f"versiq driver: error: cannot listen on {path}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    from versiq.ingest.spark import master_url

    with held:
        # the code and environment as this process started, before Spark adds to the environment
        driver = Driver(None, master_url(args.master), parse)
        driver.end_when_outdated = args.after_pid is not None
        with _stop_on_signals(driver.stopping), contextlib.ExitStack() as stack:
            try:
                server = stack.enter_context(staged(path))
            except OSError as exc:
                print(f"versiq driver: error: cannot listen on {path}: {exc}", file=sys.stderr)
                return EXIT_USAGE
            if args.after_pid is not None:
                _wait_for_exit(args.after_pid, driver.stopping)
            return _drive(driver, server, path, idle_s, warm=not args.no_warm_up)


def _status(path: str, stop: bool) -> int:
    """``versiq driver --status`` / ``--stop``: the driver on ``path`` (its pid, serving or
    starting); ``stop`` sends it SIGTERM and waits until it has ended (after the run in
    progress), only when that pid is this user's driver serving the path (``serving_problem``).
    Exit 0, or 1 when no driver holds the path or the pid is not known to be its driver."""
    pid = driver_pid(path)
    if pid is None:
        print(f"versiq driver: no driver on {path}")
        return EXIT_FAILED
    if not stop:
        print(f"versiq driver: pid {pid} {'serving' if os.path.exists(path) else 'starting'} on {path}")
        return EXIT_OK
    problem = serving_problem(path, pid)
    if problem is not None:
        print(f"versiq driver: error: not stopping pid {pid}, which {lock_path(path)} names: it is not known to "
              f"be this user's driver on that socket ({problem})", file=sys.stderr)
        return EXIT_FAILED
    print(f"versiq driver: stopping pid {pid} on {path} (it finishes the run in progress)", flush=True)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    while driver_pid(path) == pid:
        time.sleep(0.2)
    print(f"versiq driver: pid {pid} has ended")
    return EXIT_OK


def _wait_for_exit(pid: int, stopping: threading.Event) -> None:
    """Until process ``pid`` has ended (a CLI run that started this driver, ``--after-pid``) or
    the driver is signalled to stop: the driver's JVM start and warm-up, about 20 s of CPU,
    would otherwise slow that run (by half, for one record on two cores). The path stays
    claimed meanwhile. A pidfd becomes readable when the process ends, whether or not its parent
    has reaped it yet (``os.kill(pid, 0)`` would wait for a zombie), and it names that process,
    not a later one with its pid."""
    try:
        handle = os.pidfd_open(pid)
    except OSError:  # already gone
        return
    try:
        while not stopping.is_set() and not select.select([handle], [], [], 0.2)[0]:
            pass
    finally:
        os.close(handle)


def _drive(driver: Driver, server: socket.socket, path: str, idle_s: float, warm: bool) -> int:
    """``driver_command`` once the path is this driver's (``claim``) and its staging socket
    listens (``staged``): start Spark, warm it up, publish the socket, serve. Spark is stopped and
    the published socket removed however this ends."""
    from versiq.ingest.spark import get_spark

    started = time.monotonic()
    published: tuple[int, int] | None = None
    try:
        if driver.stopping.is_set():  # signalled while waiting for --after-pid: no JVM
            return EXIT_OK
        driver.spark = get_spark(driver.master, "versiq-driver")
        if warm and not driver.stopping.is_set():
            warm_up(driver.spark)
        if driver.stopping.is_set():  # signalled while starting (``--stop``): never serve
            return EXIT_OK
        try:
            published = publish(path)
        except OSError as exc:
            print(f"versiq driver: error: cannot listen on {path}: {exc}", file=sys.stderr)
            return EXIT_USAGE
        log.info("resident driver ready on %s (pid %d, master %s, %.1fs to start); idle timeout %gs",
                 path, os.getpid(), driver.master, time.monotonic() - started, idle_s)
        print(f"versiq driver: ready on {path}", flush=True)
        driver.last_run = time.monotonic()
        _serve(server, driver, idle_s)
    finally:
        unpublish(path, published)
        if driver.spark is not None:
            with contextlib.suppress(Exception):
                driver.spark.stop()
    return EXIT_OK


def _serve(server: socket.socket, driver: Driver, idle_s: float) -> None:
    """Accept clients (a thread each) until stopped or idle for ``idle_s``; then wait for the
    run in progress (a request that takes the run lock after that finds ``stopping`` set)."""
    server.settimeout(0.2)
    while not driver.stopping.is_set():
        try:
            conn, _ = server.accept()
        except TimeoutError:
            if not driver.run_lock.locked() and time.monotonic() - driver.last_run > idle_s:
                log.info("resident driver: no request for %gs; stopping", idle_s)
                break
            continue
        # (``last_run``, not the time of this connection: refused requests and probes do not keep a driver alive)
        threading.Thread(target=driver.handle, args=(conn,), daemon=True, name="versiq-driver-request").start()
    driver.stopping.set()
    with driver.run_lock:  # the run in progress ends first
        pass
