"""Shared helpers of the service tests: real Delta stores (tests.support.storebuilder) and a live
uvicorn server on 127.0.0.1 in a background thread. No tests here."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import quote

import httpx
import uvicorn

from tests.support.server_process import free_ports
from tests.support.storebuilder import StoreBuilder, StreamBuilder
from versiq.service.app import create_app
from versiq.service.http import VersiqHttpProtocol
from versiq.service.settings import Settings

T0 = 1_700_000_000_000
HOUR = 3_600_000
#: Keys that must round-trip through the path (docs/contract.md, HTTP request details).
ODD_KEYS = [
    "a/b", "foo/versions", "100%", "a%2Fb", "what?x=1&y=2", "with space", "+plus+",
    "ünïcødé/🎉", "#hash", "semi;colon", "back\\slash", "tab\there",
]
#: Dot-segment keys: HTTP clients remove ``.``/``..`` segments, so they must be sent as ``%2E``.
DOT_KEYS = [".", ".."]
HIST_VERSIONS = 250
#: Runs of the ``clicks`` stream (record counts); 100 records in all.
CLICK_RUNS = (40, 35, 25)
STREAM_KEYS = ["u-0", "u-1", "u-2", "u-3", "u-4", "a/b", "+plus+", "ünï/🎉"]
#: Provenance of the derived store ``expensive`` and the derived stream ``clicks_priced``.
EXPENSIVE_INPUTS = {"prices": 0}
EXPENSIVE_SOURCES = {"prices": {"run": 1, "snapshot": 0}}
PRICED_INPUTS = {"clicks": 2, "prices": 0}
PRICED_SOURCES = {"clicks": {"run": 3, "snapshot": 2}, "prices": {"run": 1, "snapshot": 0}}


@dataclass
class Warehouse:
    path: str
    prices: StoreBuilder
    live: StoreBuilder
    clicks: StreamBuilder
    clicks_priced: StreamBuilder


def click(i: int) -> tuple[str, str | None, int]:
    """The i-th record of ``clicks``: timestamps are a permutation of T0 + [0, 100) s, so
    stream order and timestamp order differ; every 9th value is null."""
    key = STREAM_KEYS[(i * 5) % len(STREAM_KEYS)]
    value = None if i % 9 == 4 else '{"page":"/p' + str(i) + '","price":1.50}'
    return key, value, T0 + ((i * 37) % 100) * 1000


def build_warehouse(path: str) -> Warehouse:
    """Stores ``prices`` (versioned, 1 h retention), ``sessions`` (timestamped), ``live``
    (mutated by tests), ``expensive`` (a derived store with provenance); streams ``clicks``
    (three runs, snapshots 0-2) and ``clicks_priced`` (a derived stream with provenance)."""
    prices = StoreBuilder(path, "prices", history_retention_ms=HOUR)
    recs: list[tuple[str, str | None, int]] = [
        ("p-1", '{"price":1.50,"currency":"EUR"}', T0),
        ("expiring", '"v1"', T0),
        ("expiring", '"v2"', T0 + 1000),
        ("p-1", '{"price":2.00,"currency":"EUR"}', T0 + 9 * HOUR + 500),
        ("deleted", '"alive"', T0 + 9 * HOUR + 100),
        ("deleted", None, T0 + 9 * HOUR + 200),
        ("empty", '""', T0 + 9 * HOUR),
    ]
    recs += [(k, '{"k":' + _json_str(k) + "}", T0 + 9 * HOUR + i) for i, k in enumerate(ODD_KEYS + DOT_KEYS)]
    recs += [("hist", str(i), T0 + 9 * HOUR + i * 1000) for i in range(HIST_VERSIONS)]
    recs += [("clock", "0", T0 + 10 * HOUR)]
    prices.apply(recs)
    sessions = StoreBuilder(path, "sessions", kind="timestamped")
    sessions.apply([("s-1", '{"user":"ann"}', T0), ("s-1", '{"user":"bob"}', T0 - 5)])
    live = StoreBuilder(path, "live", history_retention_ms=100 * HOUR)
    live.apply([("k", str(i), T0 + i) for i in range(0, 100, 2)])
    expensive = StoreBuilder(path, "expensive", history_retention_ms=HOUR)
    expensive.apply([("p-1", '{"price":2.00,"currency":"EUR"}', T0 + 9 * HOUR + 500)],
                    inputs=EXPENSIVE_INPUTS, sources=EXPENSIVE_SOURCES)
    clicks = StreamBuilder(path, "clicks")
    start = 0
    for n in CLICK_RUNS:
        clicks.append([click(i) for i in range(start, start + n)])
        start += n
    priced = StreamBuilder(path, "clicks_priced")
    priced.append([(k, '{"left":{"n":' + str(i) + '},"right":null}', T0 + i) for i, k in enumerate(STREAM_KEYS[:5])],
                  inputs=PRICED_INPUTS, sources=PRICED_SOURCES)
    return Warehouse(path, prices, live, clicks, priced)


def _json_str(text: str) -> str:
    import json

    return json.dumps(text)


def free_port() -> int:
    """A free port on 127.0.0.1 for a server of the tests (``free_ports``: outside the ephemeral range,
    one slice per test worker)."""
    return free_ports(1)[0]


@contextmanager
def live_server(settings: Settings) -> Iterator[str]:
    """Serve ``create_app(settings)`` on 127.0.0.1 (random port); yields the base URL."""
    app = create_app(settings)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="on", http=VersiqHttpProtocol))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def key_path(store: str, key: str, suffix: str = "") -> str:
    return f"/v1/stores/{quote(store, safe='')}/keys/{quote(key, safe='')}{suffix}"


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@contextmanager
def serve_process(warehouse: str, env: dict[str, str] | None = None) -> Iterator[tuple[int, int]]:
    """The real ``versiq serve`` command on a free port, ready: (port, pid); stopped with SIGINT
    after the block (killed if it does not stop within 30 s)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "versiq.cli", "serve", "--warehouse", warehouse,
                             "--port", str(port), "--log-level", "WARNING"],
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT, **(env or {})},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "versiq serve did not start"
            time.sleep(0.1)
        yield port, proc.pid
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
