"""Long polls of the change feed (``changes?wait=``) against a real server: waiting costs nothing
until a commit lands (no thread held, no polling: the server's CPU stays low and a key listing
stays fast while hundreds of requests wait), a commit wakes every waiter at once, and a
``sinceSnapshot`` the store never committed is a 400 at once, not after the wait."""

from __future__ import annotations

import json
import socket
import statistics
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.service import T0, live_server
from tests.support.storebuilder import StoreBuilder
from versiq.service.settings import Settings

WAITERS = 300


@pytest.fixture
def served(tmp_path: Any) -> Iterator[tuple[StoreBuilder, httpx.Client]]:
    builder = StoreBuilder(str(tmp_path), "s", history_retention_ms=10 ** 9)
    builder.apply([(f"k-{i:04d}", str(i), T0 + i) for i in range(500)])
    with live_server(Settings(warehouse=str(tmp_path))) as url, httpx.Client(base_url=url, timeout=30) as client:
        yield builder, client


def _listing_ms(client: httpx.Client, n: int = 15) -> float:
    """The median time of ``n`` key listings (100 keys each), in ms."""
    times = []
    for _ in range(n):
        started = time.perf_counter()
        assert client.get("/v1/stores/s/keys", params={"pageSize": 100}).status_code == 200
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def _send_wait(base_url: str, since: int) -> socket.socket:
    """A ``changes?wait=30s`` request sent on its own connection; the answer is read later."""
    host, port = base_url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(f"GET /v1/stores/s/changes?sinceSnapshot={since}&wait=30s HTTP/1.1\r\n"
                 f"Host: {host}\r\nConnection: close\r\n\r\n".encode())
    return sock


def _answer(sock: socket.socket) -> tuple[int, dict[str, Any]]:
    """The status and JSON body of the answer on ``sock`` (``Connection: close``: read to EOF)."""
    data = b""
    with sock:
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(body)


def test_many_waiters_cost_nothing_until_a_commit_wakes_them(served: tuple[StoreBuilder, httpx.Client]) -> None:
    builder, client = served
    since = builder.version
    before_ms = _listing_ms(client)
    waiters = [_send_wait(str(client.base_url), since) for _ in range(WAITERS)]
    try:
        time.sleep(1.0)  # every request read and waiting
        cpu = time.process_time()  # the server runs in this process; the test thread only sleeps
        time.sleep(2.0)
        idle_cpu_s = time.process_time() - cpu
        during_ms = _listing_ms(client)
        committed = builder.apply([("k-0000", '"new"', T0 + 10_000)])
        woken = time.monotonic()
        answers = [_answer(sock) for sock in waiters]
        woken_s = time.monotonic() - woken
    finally:
        for sock in waiters:
            sock.close()
    assert idle_cpu_s < 0.2, f"{WAITERS} waiting requests burn {idle_cpu_s:.2f} s of CPU in 2 s"
    assert during_ms < 2 * before_ms + 50, f"a key listing takes {during_ms:.0f} ms while requests wait " \
                                           f"({before_ms:.0f} ms without)"
    assert woken_s < 10, f"the commit woke the waiters after {woken_s:.1f} s"
    for status, body in answers:
        assert status == 200, body
        assert body["snapshot"] == committed
        assert {c["key"] for c in body["changes"]} == {"k-0000"} and "new" in [c["value"] for c in body["changes"]]


def test_a_since_snapshot_never_committed_is_a_400_at_once(served: tuple[StoreBuilder, httpx.Client]) -> None:
    builder, client = served
    started = time.monotonic()
    r = client.get("/v1/stores/s/changes", params={"sinceSnapshot": builder.version + 5, "wait": "30s"})
    assert time.monotonic() - started < 5, "answered after the wait"
    assert r.status_code == 400, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert r.json()["parameter"] == "sinceSnapshot"
    r = client.get("/v1/stores/s/changes", params={"sinceSnapshot": builder.version + 5, "wait": "30s"},
                   headers={"Accept": "application/x-ndjson"})
    assert r.status_code == 400 and time.monotonic() - started < 10, r.text


def test_a_wait_at_the_head_ends_empty_after_its_time(served: tuple[StoreBuilder, httpx.Client]) -> None:
    builder, client = served
    started = time.monotonic()
    r = client.get("/v1/stores/s/changes", params={"sinceSnapshot": builder.version, "wait": "300ms"})
    assert r.status_code == 200 and r.json()["changes"] == [], r.text
    assert 0.25 < time.monotonic() - started < 5
