"""Unit tests of the service's pure pieces: percent-decoding, routing, query parsing, page
tokens, settings; plus the ``versiq serve`` command (subprocess)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.support.service import build_warehouse, free_port, key_path
from versiq.service.params import parse_query, percent_decode
from versiq.service.problems import Problem
from versiq.service.routes import (
    ROUTE_BATCH_GET,
    ROUTE_KEY,
    ROUTE_KEYS,
    ROUTE_STREAM,
    ROUTE_STREAM_RECORDS,
    ROUTE_STREAMS,
    ROUTE_VERSIONS,
    Route,
    match_v1,
    split_path,
)
from versiq.service.settings import ConfigError, Settings
from versiq.service.tokens import STREAM_RECORDS, PageQuery, PageTokens

ROOT = Path(__file__).resolve().parents[2]  # the repository


def test_percent_decode() -> None:
    assert percent_decode(b"a%2Fb", plus_is_space=False, what="k") == "a/b"
    assert percent_decode(b"a%252F", plus_is_space=False, what="k") == "a%2F"  # decoded once
    assert percent_decode(b"a+b", plus_is_space=False, what="k") == "a+b"
    assert percent_decode(b"a+b%2B", plus_is_space=True, what="q") == "a b+"
    assert percent_decode(b"%C3%BC", plus_is_space=False, what="k") == "ü"
    for bad in (b"%", b"%2", b"%zz", b"a%g1", b"%C3", b"%ff", b"%ED%A0%80"):
        with pytest.raises(Problem) as exc:
            percent_decode(bad, plus_is_space=False, what="the key")
        assert exc.value.status == 400 and "the key" in exc.value.detail


def test_routing_on_raw_path() -> None:
    route = match_v1(split_path(b"/v1/stores/s/keys/foo%2Fversions"))
    assert route is not None and route.template == ROUTE_KEY and route.key == "foo/versions"
    route = match_v1(split_path(b"/v1/stores/s/keys/foo/versions"))
    assert route is not None and route.template == ROUTE_VERSIONS and route.key == "foo"
    assert match_v1(split_path(b"/v1/stores/s/keys")) == Route(ROUTE_KEYS, "s")
    assert match_v1(split_path(b"/v1/stores/s/keys:batchGet")) == Route(ROUTE_BATCH_GET, "s")
    assert match_v1(split_path(b"/v1/stores/s/keys%3AbatchGet")) == Route(ROUTE_BATCH_GET, "s")
    for path in (b"/v2/stores", b"/v1/stores/s/keyz", b"/v1/stores/s/keys:get", b"/v1/stores/s/x/k",
                 b"/v1/stores/s/keys/k/v"):
        assert match_v1(split_path(path)) is None


def test_stream_routes() -> None:
    assert match_v1(split_path(b"/v1/streams")) == match_v1(split_path(b"/v1/streams?x=1"))
    route = match_v1(split_path(b"/v1/streams"))
    assert route is not None and route.template == ROUTE_STREAMS
    route = match_v1(split_path(b"/v1/streams/a%2Eb"))
    assert route is not None and route.template == ROUTE_STREAM and route.stream == "a.b" and route.store is None
    route = match_v1(split_path(b"/v1/streams/s/records"))
    assert route is not None and route.template == ROUTE_STREAM_RECORDS and route.stream == "s"
    for path in (b"/v1/streams/s/records/x", b"/v1/streams/s/keys", b"/v1/streams/s/x", b"/v1/stream"):
        assert match_v1(split_path(path)) is None


def test_stream_tokens() -> None:
    tokens = PageTokens(b"k", ttl_s=60)
    q = PageQuery("clicks", None, None, 5, "desc", STREAM_RECORDS)
    token = tokens.issue(q, snapshot=4, resume_after=(2, 17), now=1000.0)
    pos = tokens.resolve(token, q, now=1001.0)
    assert (pos.snapshot, pos.position, pos.query) == (4, (2, 17), q)
    for other in (PageQuery("clicks", "k", None, 5, "desc", STREAM_RECORDS),
                  PageQuery("other", None, None, 5, "desc", STREAM_RECORDS),
                  PageQuery("clicks", None, None, None, "desc", STREAM_RECORDS),
                  PageQuery("clicks", None, None, 5, "asc", STREAM_RECORDS)):
        with pytest.raises(Problem, match="differ") as exc:
            tokens.resolve(token, other, now=1001.0)
        assert exc.value.status == 400
    # a stream token is not a versions token of a store with the same name, and the reverse
    with pytest.raises(Problem, match="another kind of listing"):
        tokens.resolve(token, PageQuery("clicks", "k", None, 5, "desc"), now=1001.0)
    versions = tokens.issue(PageQuery("clicks", "k", None, 5, "desc"), snapshot=4, resume_after=3, now=1000.0)
    with pytest.raises(Problem, match="another kind of listing"):
        tokens.resolve(versions, PageQuery("clicks", "k", None, 5, "desc", STREAM_RECORDS), now=1001.0)
    with pytest.raises(Problem) as exc:
        tokens.resolve(token, q, now=1061.0)
    assert exc.value.status == 410


def test_parse_query() -> None:
    assert parse_query(b"asOf=1&snapshot=2", ("asOf", "snapshot")) == {"asOf": "1", "snapshot": "2"}
    assert parse_query(b"asOf=2024-01-01T00:00:00+01:00&", ("asOf",)) == {"asOf": "2024-01-01T00:00:00 01:00"}
    assert parse_query(b"", ()) == {}
    with pytest.raises(Problem, match="'asof'"):
        parse_query(b"asof=1", ("asOf",))
    with pytest.raises(Problem, match="repeated"):
        parse_query(b"asOf=1&asOf=1", ("asOf",))
    with pytest.raises(Problem, match="percent-escape"):
        parse_query(b"asOf=%x1", ("asOf",))


def test_tokens_round_trip_binding_and_expiry() -> None:
    tokens = PageTokens(b"k", ttl_s=60)
    q = PageQuery("s", "ké/y", 1, None, "asc")
    token = tokens.issue(q, snapshot=3, resume_after=42, now=1000.0)
    pos = tokens.resolve(token, q, now=1030.0)
    assert (pos.snapshot, pos.resume_after) == (3, 42)
    with pytest.raises(Problem) as exc:
        tokens.resolve(token, q, now=1061.0)
    assert exc.value.status == 410
    for other in (PageQuery("s", "ké/y", 1, None, "desc"), PageQuery("s", "k", 1, None, "asc"),
                  PageQuery("t", "ké/y", 1, None, "asc"), PageQuery("s", "ké/y", None, None, "asc"),
                  PageQuery("s", "ké/y", 1, 5, "asc")):
        with pytest.raises(Problem) as exc:
            tokens.resolve(token, other, now=1001.0)
        assert exc.value.status == 400
    with pytest.raises(Problem):
        PageTokens(b"other", 60).resolve(token, q, now=1001.0)
    for bad in ("", ".", "x.y", token.replace(".", ""), token[1:], "é.é", "!!.!!"):
        with pytest.raises(Problem) as exc:
            tokens.resolve(bad, q, now=1001.0)
        assert exc.value.status == 400


def test_settings_from_env(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        Settings.from_env({})
    s = Settings.from_env({"VERSIQ_WAREHOUSE": "w"})
    assert s.api_tokens is None and s.token_ttl_s == 3600 and s.cors_origins == ()
    s2 = Settings.from_env({"VERSIQ_WAREHOUSE": "w"})
    assert s.token_secret != s2.token_secret  # random per process when unset
    f = tmp_path / "t"
    f.write_text("a\n# c\n\nb\n")
    s = Settings.from_env({"VERSIQ_WAREHOUSE": "w", "VERSIQ_TOKEN_SECRET": "x", "VERSIQ_PAGE_TOKEN_TTL": "5m",
                           "VERSIQ_API_TOKENS_FILE": str(f), "VERSIQ_CORS_ORIGINS": "https://a, https://b",
                           "VERSIQ_REFRESH_INTERVAL": "250ms"})
    assert s.token_secret == b"x" and s.token_ttl_s == 300 and s.api_tokens == {"a", "b"}
    assert s.cors_origins == ("https://a", "https://b") and s.refresh_interval_s == 0.25
    for env in ({"VERSIQ_PAGE_TOKEN_TTL": "soon"}, {"VERSIQ_API_TOKENS": " , "},
                {"VERSIQ_API_TOKENS_FILE": str(tmp_path / "missing")}):
        with pytest.raises(ConfigError):
            Settings.from_env({"VERSIQ_WAREHOUSE": "w", **env})


def _versiq(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "versiq.cli", *args], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, env={**os.environ, **(env or {})})


def test_serve_refuses_missing_warehouse(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "VERSIQ_WAREHOUSE"}
    proc = subprocess.run([sys.executable, "-m", "versiq.cli", "serve"], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, env=env)
    assert proc.returncode == 2 and "warehouse" in proc.stderr
    proc = _versiq("serve", "--warehouse", str(tmp_path / "nope"))
    assert proc.returncode == 2 and "not a directory" in proc.stderr
    proc = _versiq("serve", "--warehouse", str(tmp_path), env={"VERSIQ_PAGE_TOKEN_TTL": "x"})
    assert proc.returncode == 2 and "VERSIQ_PAGE_TOKEN_TTL" in proc.stderr


def test_serve_two_workers_json_logs(tmp_path: Path) -> None:
    wh = build_warehouse(str(tmp_path / "wh"))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "VERSIQ_TOKEN_SECRET"}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.Popen(
        [sys.executable, "-m", "versiq.cli", "serve", "--warehouse", wh.path, "--port", str(port),
         "--workers", "2", "--log-format", "json"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "server did not start"
            time.sleep(0.1)
        # page tokens issued by one worker are accepted by the other (shared secret)
        path = url + key_path("prices", "hist", "/versions")
        for _ in range(6):
            with httpx.Client() as c:  # new connection: may land on either worker
                token = c.get(path, params={"pageSize": 3}).json()["nextPageToken"]
            with httpx.Client() as c:
                assert c.get(path, params={"pageToken": token}).status_code == 200
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines, "no log output"
    for line in lines:
        json.loads(line)  # every log line is one JSON object
