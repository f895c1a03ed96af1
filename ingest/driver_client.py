"""The client side of the resident driver (``ingest.driver``): where its socket is, what a
request must match, and ``forward``, which hands a batch ``versiq ingest`` to a listening driver.

Kept apart from the driver so that a ``versiq ingest`` served by a driver imports neither Spark
nor Delta nor Arrow (about 0.3 s of a run that takes a few seconds); the protocol is described
in ``ingest.driver`` and docs/contract.md.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import socket
import stat
import struct
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

import versiq
from versiq import settings
from versiq.package import jar_files, package_files, package_root

log = logging.getLogger("versiq.ingest")

SOCKET_ENV = settings.DRIVER_SOCKET.name
#: ``VERSIQ_DRIVER_AUTOSTART=30m``: a run that needs Spark and finds no driver starts one in the
#: background, which ends after this long without a run (unset, empty, ``off`` or 0: never).
AUTOSTART_ENV = settings.DRIVER_AUTOSTART.name
#: ``VERSIQ_DRIVER_SOCKET=off``: no driver is used (nor started on the default path).
OFF = "off"
#: Environment variables whose values shape a run: a request must have the driver's.
RUN_ENV_PREFIXES = (settings.PREFIX, "AWS_", "SPARK_", "PYSPARK_", "HADOOP_", "JAVA_")
#: ... and these, by name: the time zone, the temporary folder and the home folder.
RUN_ENV_NAMES = frozenset({"TZ", "TMPDIR", "HOME"})
#: ... except these: the socket itself, and the log settings (the request's argv carries them);
#: and what a PySpark session sets in its own process for its Python workers, which every
#: session that starts sets again (``pyspark.core.context``): a ``versiq ingest`` launched from
#: a process that runs PySpark itself (an orchestrator's task) inherits them, and they do not
#: shape the run.
CLIENT_ONLY_ENV = frozenset({SOCKET_ENV, AUTOSTART_ENV, settings.LOG_FORMAT.name, settings.LOG_LEVEL.name,
                             "SPARK_AUTH_SOCKET_TIMEOUT", "SPARK_BUFFER_SIZE"})
#: Variables ``ingest.spark.get_spark`` sets to the running interpreter when they are unset:
#: unset and set to that interpreter are one setting (the interpreter is part of the code
#: identity, so a driver and its clients share it).
INTERPRETER_DEFAULTS = ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")
#: How long a client waits to connect to a socket that exists (a driver answers at once).
CONNECT_TIMEOUT_S = 2.0


def socket_path(environ: Mapping[str, str] | None = None) -> str | None:
    """The driver's socket: ``VERSIQ_DRIVER_SOCKET``, else the user's runtime folder; None when
    it is ``off``."""
    env = os.environ if environ is None else environ
    value = settings.DRIVER_SOCKET.value(env)
    if value is not None and value.lower() == OFF:
        return None
    if value:
        return os.path.abspath(value)
    base = env.get("XDG_RUNTIME_DIR") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "versiq", "driver.sock")


def lock_path(path: str) -> str:
    """The file a driver holds locked for its whole life (``driver.claim``): one per socket path."""
    return f"{path}.lock"


def log_path(path: str) -> str:
    """Where a driver started by ``autostart_hook`` writes its standard output and error
    (appended; started afresh when it has grown past ``MAX_LOG_BYTES``)."""
    return f"{path}.log"


#: A started driver's log is cut when it is larger than this before another driver starts.
MAX_LOG_BYTES = 1 << 20


def folder_problem(folder: str) -> str | None:
    """Why ``folder`` may not hold a driver's socket, lock file and log (None: it may): it must
    be this user's alone (owned by this user, mode 0700), or another user could replace those
    files between a check and their use. Every driver and every autostart is held to it."""
    info = os.stat(folder)
    if info.st_uid != os.getuid():
        return f"the folder {folder} belongs to user {info.st_uid}, not to this user"
    if info.st_mode & 0o077:
        return f"the folder {folder} has mode {stat.S_IMODE(info.st_mode):04o}, not this user's alone (0700)"
    return None


def open_own_file(path: str, flags: int, mode: int = 0o600) -> int:
    """``os.open(path, flags)`` that never follows a link at ``path`` (``O_NOFOLLOW``) and accepts
    only a regular file of this user (checked on the open file, ``fstat``): a lock file or log
    planted as a link or a FIFO is never truncated, written or trusted. Raises ``OSError``."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, mode)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
            raise OSError(f"{path} is not a regular file of this user")
    except BaseException:
        os.close(fd)
        raise
    return fd


#: The distributions whose versions a run depends on (besides versiq's own files).
RUN_DISTRIBUTIONS = ("pyspark", "delta-spark", "deltalake", "pyarrow", "duckdb")


def run_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``environ`` that shape a run (``RUN_ENV_PREFIXES`` and ``RUN_ENV_NAMES``,
    less ``CLIENT_ONLY_ENV``), each as a digest of its value: a request names the variables
    that differ, and carries no secret (``AWS_SECRET_ACCESS_KEY``) in clear. The digest is of the
    value's bytes (a value that is not UTF-8 counts too). The variables of
    ``INTERPRETER_DEFAULTS`` count with their default."""
    effective = {name: sys.executable for name in INTERPRETER_DEFAULTS} | absolute_interpreters(environ)
    return {name: hashlib.sha256(os.fsencode(value)).hexdigest()[:32] for name, value in effective.items()
            if (name.startswith(RUN_ENV_PREFIXES) or name in RUN_ENV_NAMES) and name not in CLIENT_ONLY_ENV}


def absolute_interpreters(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` with relative paths in ``INTERPRETER_DEFAULTS`` made absolute: such a path
    means this process's folder, not that of a driver (which runs elsewhere)."""
    out = dict(environ)
    for name in INTERPRETER_DEFAULTS:
        if os.sep in out.get(name, "") and not os.path.isabs(out[name]):
            out[name] = os.path.abspath(out[name])
    return out


def current_umask() -> int:
    """This process's umask (the mode bits that files it creates do not get). A driver's JVM
    writes files with the umask it started with, so a request must have the same."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def code_identity() -> str:
    """The interpreter and the code this process runs: the versiq package's version, its
    location, a digest of its files' (path, size, modification time), of the jars its Spark
    session loads (``package.jar_files``: Delta's, versiq's LogStore, S3A; name, size,
    modification time) and the versions of the libraries a run uses (``RUN_DISTRIBUTIONS``). A
    driver started before a checkout, an install, an upgrade or a rebuilt jar changed refuses
    the next request instead of running old code. Stats only (a few dozen files): a client
    computes it for every request."""
    from importlib import metadata

    root = package_root()
    digest = hashlib.sha256()
    for name in RUN_DISTRIBUTIONS:
        try:
            digest.update(f"{name}=={metadata.version(name)}\n".encode())
        except metadata.PackageNotFoundError:
            digest.update(f"{name} absent\n".encode())
    for path in package_files():
        digest.update(_file_line(os.path.relpath(path, root), path))
    for path in jar_files():
        digest.update(_file_line(f"jar {os.path.basename(path)}", path))
    return f"versiq {versiq.__version__} at {root} on {sys.executable}, files {digest.hexdigest()[:16]}"


def _file_line(name: str, path: str) -> bytes:
    """``name`` with the size and modification time of ``path`` (links followed); a file that
    cannot be read (a link to nowhere, such as an editor's lock file, or one removed meanwhile)
    counts as absent rather than failing the run."""
    try:
        info = os.stat(path)
    except OSError:
        return f"{name} absent\n".encode(errors="surrogateescape")
    return f"{name}:{info.st_size}:{info.st_mtime_ns}\n".encode(errors="surrogateescape")


class ByteStream(Protocol):
    """Where messages go: a socket's ``makefile("rwb")``."""

    def write(self, data: bytes, /) -> int: ...

    def flush(self) -> None: ...


def send(stream: ByteStream, message: dict[str, Any]) -> None:
    stream.write(json.dumps(message).encode() + b"\n")
    stream.flush()


def forward(argv: list[str], args: argparse.Namespace) -> int | None:
    """Run ``versiq <argv>`` (an ``ingest`` in batch mode, parsed as ``args``) in the resident
    driver and return its exit status, printing what the run prints; None when no driver runs it
    (none listens, it refused, or it ended during the run): the caller runs it itself."""
    path = socket_path()
    if path is None or args.continuous:
        return None
    conn = _connect(path)
    if conn is None:
        return None
    owner = peer_uid(conn)
    if owner != os.getuid():  # only this user's own driver may run this user's ingest
        conn.close()
        log.warning("the process listening on %s runs as user %s, not as this user: not using it", path, owner)
        return None
    request = {"argv": [*argv, "--log-format", args.log_format, "--log-level", args.log_level],
               "cwd": os.getcwd(), "env": run_environment(os.environ), "umask": current_umask(),
               "code": code_identity()}
    with conn, conn.makefile("rwb") as stream:
        for message in _messages(stream, request):
            if "refused" in message:
                log.info("the resident driver at %s does not run this: %s; running here", path, message["refused"])
                return None
            if "exit" in message:
                return int(message["exit"])
            for key, out in (("out", sys.stdout), ("err", sys.stderr)):
                if key in message:
                    with contextlib.suppress(OSError, ValueError):  # a closed pipe here does not stop the run
                        out.write(message[key])
                        out.flush()
    log.warning("the resident driver at %s ended during the run; running here (a run commits whole or "
                "not at all)", path)
    return None


def _connect(path: str) -> socket.socket | None:
    """A connection to the driver listening at ``path``; None when none does."""
    if not os.path.exists(path):
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(CONNECT_TIMEOUT_S)
        conn.connect(path)
        conn.settimeout(None)
    except OSError as exc:  # a socket left by a driver that was killed: nobody listens
        conn.close()
        log.debug("no resident driver at %s (%s)", path, exc)
        return None
    return conn


def autostart_hook(args: argparse.Namespace, environ: Mapping[str, str] | None = None
                   ) -> Callable[[], object] | None:
    """With ``VERSIQ_DRIVER_AUTOSTART`` set, what a batch ``versiq ingest`` running in its own
    process calls when its run starts Spark (``spark.SparkOnDemand``): start a resident driver
    for the runs after this one. None when the variable is unset (the default), off or invalid
    (a warning), with ``--continuous`` or ``--master`` (the driver's master is the default one),
    or with no socket (``VERSIQ_DRIVER_SOCKET=off``).

    Started when Spark starts, not before: a run with nothing new or a refused setting needs no
    JVM, and starts none. The driver starts Spark in the background once this process has ended
    (so that it does not slow this run down), without warm-up runs so that it serves a few seconds
    later (its first runs compile as they go); this run goes on in its own JVM. It is a process of its own
    session (a Ctrl-C of this run does not reach it), writes its output to ``log_path`` and ends
    after the variable's duration without a run."""
    env = os.environ if environ is None else environ
    path = socket_path(env)
    if not settings.DRIVER_AUTOSTART.text(env) or path is None or args.continuous or args.master is not None:
        return None
    if not env.get("SPARK_MASTER", "local").startswith("local"):  # a cluster's executors stay the job's
        return None
    try:
        idle = settings.DRIVER_AUTOSTART.value(env)  # None: off, or "0"
    except settings.SettingError as exc:
        log.warning("%s; not starting a resident driver", exc)
        return None
    if idle is None:
        return None
    return lambda: start_driver(path, idle)


def start_driver(path: str, idle: str) -> subprocess.Popen[bytes] | None:
    """Start ``versiq driver`` on ``path`` in the background (``autostart_hook``), unless a driver
    listens there or is starting (it holds ``lock_path``); returns its process, or None."""
    if _driver_present(path):
        return None
    folder = os.path.dirname(path)
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        problem = folder_problem(folder)
        if problem is not None:
            log.warning("not starting a resident driver on %s: %s", path, problem)
            return None
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
        with contextlib.suppress(OSError):
            if os.stat(log_path(path), follow_symlinks=False).st_size > MAX_LOG_BYTES:
                flags |= os.O_TRUNC
        out = open_own_file(log_path(path), flags)
        try:
            # -P and PYTHONPATH: the driver imports this process's versiq, whatever the folder and
            # the installation say (the driver refuses other code; here it would never serve)
            env = {**absolute_interpreters(os.environ), "PYTHONPATH": os.pathsep.join(  # it runs in /
                p for p in (os.path.dirname(package_root()), os.environ.get("PYTHONPATH")) if p)}
            proc = subprocess.Popen(
                [sys.executable, "-P", "-m", "versiq.cli", "driver", "--socket", path, "--idle-timeout", idle,
                 "--after-pid", str(os.getpid()), "--no-warm-up"],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd="/", env=env,
                start_new_session=True)
        finally:
            os.close(out)
    except OSError as exc:
        log.warning("could not start a resident driver on %s: %s", path, exc)
        return None
    log.info("started a resident driver (pid %d) on %s for the runs after this one; it ends after %s "
             "without a run ('versiq driver --stop' ends it now); its log: %s", proc.pid, path, idle,
             log_path(path))
    return proc


def _driver_present(path: str) -> bool:
    """Whether a driver listens at ``path`` or is starting there (holds its lock)."""
    conn = _connect(path)
    if conn is not None:
        conn.close()
        return True
    return driver_pid(path) is not None


def driver_pid(path: str) -> int | None:
    """The pid of the driver that holds ``path`` (its ``lock_path``, locked from before its JVM
    starts until it ends, with its pid inside); None when no process holds it, or when the lock
    file is not a regular file of this user (``open_own_file``)."""
    try:
        with os.fdopen(open_own_file(lock_path(path), os.O_RDONLY), "rb") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:  # held: a driver starting or serving
                text = handle.read().decode(errors="replace").strip()
                return int(text) if text.isdigit() else None
            return None
    except OSError:  # no lock file (or folder), or not ours: no driver there
        return None


def peer_credentials(conn: socket.socket) -> tuple[int, int]:
    """The (pid, user id) of the process at the other end of a Unix socket (``SO_PEERCRED``:
    pid, uid, gid as three ints; a listening socket's are those of the process that listened)."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _ = struct.unpack("3i", creds)
    return int(pid), int(uid)


def peer_uid(conn: socket.socket) -> int:
    """The user id of the process at the other end of a Unix socket (``peer_credentials``)."""
    return peer_credentials(conn)[1]


def _messages(stream: Any, request: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Send ``request``, then yield the driver's answers until it closes the connection or it
    fails (the caller's own output errors are not the driver's: ``forward`` ignores them, as
    logging does in a run of the CLI's own process)."""
    try:
        send(stream, request)
        while line := stream.readline():
            yield json.loads(line)
    except OSError as exc:
        log.debug("the resident driver's connection failed: %s", exc)
