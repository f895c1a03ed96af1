"""The client side of the resident driver (``ingest.driver``): where its socket is, what a
request must match, and ``forward``, which hands a batch ``versiq ingest`` to a listening driver.

Kept apart from the driver so that a ``versiq ingest`` served by a driver imports neither Spark
nor Delta nor Arrow (about 0.3 s of a run that takes a few seconds); the protocol is described
in ``ingest.driver`` and docs/contract.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import socket
import sys
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

import versiq

log = logging.getLogger("versiq.ingest")

SOCKET_ENV = "VERSIQ_DRIVER_SOCKET"
#: ``VERSIQ_DRIVER_SOCKET=off``: no driver is used (nor started on the default path).
OFF = "off"
#: Environment variables whose values shape a run: a request must have the driver's.
RUN_ENV_PREFIXES = ("VERSIQ_", "AWS_", "SPARK_", "PYSPARK_", "HADOOP_", "JAVA_")
#: ... except these: the socket itself, and the log settings (the request's argv carries them).
CLIENT_ONLY_ENV = frozenset({SOCKET_ENV, "VERSIQ_LOG_FORMAT", "VERSIQ_LOG_LEVEL"})
#: How long a client waits to connect to a socket that exists (a driver answers at once).
CONNECT_TIMEOUT_S = 2.0


def socket_path(environ: Mapping[str, str] | None = None) -> str | None:
    """The driver's socket: ``VERSIQ_DRIVER_SOCKET``, else the user's runtime folder; None when
    it is ``off``."""
    env = os.environ if environ is None else environ
    value = env.get(SOCKET_ENV, "")
    if value.lower() == OFF:
        return None
    if value:
        return os.path.abspath(value)
    base = env.get("XDG_RUNTIME_DIR") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "versiq", "driver.sock")


def run_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``environ`` that shape a run (``RUN_ENV_PREFIXES`` less ``CLIENT_ONLY_ENV``)."""
    return {name: value for name, value in environ.items()
            if name.startswith(RUN_ENV_PREFIXES) and name not in CLIENT_ONLY_ENV}


def code_identity() -> str:
    """The interpreter and the versiq package this process runs: its version, its location and
    a digest of its files' (path, size, modification time). A driver started before a checkout
    or an install changed refuses the next request instead of running old code."""
    root = os.path.dirname(os.path.abspath(versiq.__file__ or ""))
    digest = hashlib.sha256()
    for folder, dirs, files in os.walk(root, followlinks=True):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(".py"):
                stat = os.stat(os.path.join(folder, name))
                digest.update(f"{os.path.relpath(os.path.join(folder, name), root)}:{stat.st_size}:"
                              f"{stat.st_mtime_ns}\n".encode())
    return f"versiq {versiq.__version__} at {root} on {sys.executable}, files {digest.hexdigest()[:16]}"


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
    if path is None or args.continuous or not os.path.exists(path):
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
    request = {"argv": [*argv, "--log-format", args.log_format, "--log-level", args.log_level],
               "cwd": os.getcwd(), "env": run_environment(os.environ), "code": code_identity()}
    with conn, conn.makefile("rwb") as stream:
        for message in _messages(stream, request):
            if "refused" in message:
                log.info("the resident driver at %s does not run this: %s; running here", path, message["refused"])
                return None
            if "exit" in message:
                return int(message["exit"])
            for key, out in (("out", sys.stdout), ("err", sys.stderr)):
                if key in message:
                    out.write(message[key])
                    out.flush()
    log.warning("the resident driver at %s ended during the run; running here (a run commits whole or "
                "not at all)", path)
    return None


def _messages(stream: Any, request: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Send ``request``, then yield the driver's answers until it closes the connection or it
    fails (the caller's own output errors are not the driver's: they are raised where they
    happen, in ``forward``)."""
    try:
        send(stream, request)
        while line := stream.readline():
            yield json.loads(line)
    except OSError as exc:
        log.debug("the resident driver's connection failed: %s", exc)
