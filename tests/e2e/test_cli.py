"""The command line's surface (help texts, flags) and the sample generator's promises.

The generated changelog is checked against the reference model (tests/support/reference.py): the counts
``versiq generate`` promises and the example answers ``versiq demo`` prints must be what a store
with the demo's settings really holds after it.
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.support.reference import InRecord, ReferenceStore
from versiq.cli.sample import SUMMARY_FILE, SampleSummary, generate, load_summary
from versiq.timestamps import TimestampError, parse_timestamp

#: The flags each subcommand promises (issues #2-#4, docs/contract.md): add, never rename.
CONTRACT_FLAGS = {
    "ingest": ["--warehouse", "--store", "--source", "--config", "--format", "--kind",
               "--history-retention", "--partitions", "--master", "--report", "--continuous",
               "--trigger-interval", "--watch-interval", "--log-format"],
    "serve": ["--warehouse", "--host", "--port", "--workers", "--log-format"],
    "driver": ["--socket", "--idle-timeout", "--master", "--no-warm-up", "--after-pid", "--status", "--stop",
               "--log-format"],
    "maintain": ["--warehouse", "--store", "--log-format"],
    "rejected": ["--warehouse", "--store", "--reason", "--format", "--log-format"],
    "demo": ["--warehouse", "--data", "--keys", "--host", "--port", "--no-serve", "--log-format"],
    "generate": ["--out", "--keys", "--versions", "--files", "--format", "--seed", "--log-format"],
    "keys": ["--warehouse", "--store", "--prefix", "--start", "--end", "--as-of", "--include-deleted",
             "--snapshot", "--log-format"],
}


def versiq(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run the installed ``versiq`` console script (the real entry point)."""
    script = Path(sys.executable).with_name("versiq")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "versiq.cli"]
    return subprocess.run(
        [*command, *args], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )


def test_top_level_help_lists_every_subcommand() -> None:
    result = versiq("--help")
    assert result.returncode == 0, result.stderr
    for command in CONTRACT_FLAGS:
        assert command in result.stdout


@pytest.mark.parametrize("command", sorted(CONTRACT_FLAGS))
def test_subcommand_help_mentions_its_flags(command: str) -> None:
    result = versiq(command, "--help")
    assert result.returncode == 0, result.stderr
    for flag in CONTRACT_FLAGS[command]:
        assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", result.stdout), (command, flag)


def test_every_command_runs_a_function_that_exists() -> None:
    """Each command's parser names what runs it; a deferred one (imported only when the command
    runs) names a function its module has."""
    import argparse

    from versiq.cli.main import build_parser
    from versiq.cli.options import Deferred

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, command in sub.choices.items():
        run = command.get_default("run")
        assert callable(run), name
        if isinstance(run, Deferred):
            assert callable(run.target()), name


def test_unknown_flag_is_a_usage_error() -> None:
    result = versiq("serve", "--no-such-flag")
    assert result.returncode == 2
    assert "--no-such-flag" in result.stderr


# ------------------------------------------------------------------------- generator

HOUR = 3_600_000


def _parse_jsonl_line(text: str) -> tuple[str, InRecord | None, dict[str, object] | None]:
    """Classify one line as the contract says: ('ok', record) or (reason, None)."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        return "malformed", None, None
    if not isinstance(obj, dict):
        return "malformed", None, None
    key = obj.get("key")
    if key is None or key == "":
        return "missing_field", None, obj
    ts = obj.get("timestamp")
    if ts is None:
        return "missing_field", None, obj
    if isinstance(ts, bool) or not isinstance(ts, int | str):
        return "bad_timestamp", None, obj
    try:
        millis = ts if isinstance(ts, int) else parse_timestamp(ts)
    except TimestampError:
        return "bad_timestamp", None, obj
    # The value's text as written (json.loads would turn 12.50 into 12.5); sample values are
    # flat objects.
    raw = re.search(r'"value":(\{[^{}]*\})', text)
    value_text = raw.group(1) if obj.get("value") is not None and raw else None
    assert (value_text is None) == (obj.get("value") is None)
    return "ok", InRecord("", 0, str(key), value_text, millis), obj


@pytest.fixture(scope="module")
def jsonl_sample(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, SampleSummary]:
    out = tmp_path_factory.mktemp("sample") / "data"
    result = versiq("generate", "--out", str(out), "--keys", "400", "--versions", "10",
                    "--files", "3", "--seed", "11")
    assert result.returncode == 0, result.stderr
    summary = load_summary(out)
    assert summary is not None
    return out, summary


def test_generate_writes_the_promised_files(jsonl_sample: tuple[Path, SampleSummary]) -> None:
    out, summary = jsonl_sample
    names = sorted(p.name for p in out.iterdir() if not p.name.startswith("_"))
    assert names == ["part-000.jsonl", "part-001.jsonl", "part-002.jsonl"] == summary.files
    lines = [line for name in names for line in (out / name).read_text("utf-8").splitlines()]
    assert all(line.strip() for line in lines)
    assert len(lines) == summary.lines
    # Number text is kept as written, trailing zeros included.
    assert any(re.search(r'"price":\d+\.\d0,', line) for line in lines)
    keys = {m.group(1) for line in lines if (m := re.search(r'"key":"(sku-\d{5})"', line))}
    assert len(keys) == summary.keys == 400


def test_generated_changelog_has_the_promised_properties(
    jsonl_sample: tuple[Path, SampleSummary],
) -> None:
    out, summary = jsonl_sample
    reasons: dict[str, int] = {}
    records: list[InRecord] = []
    raw_timestamps: list[object] = []
    for name in summary.files:
        for number, line in enumerate((out / name).read_text("utf-8").splitlines(), start=1):
            reason, record, obj = _parse_jsonl_line(line)
            if record is None:
                reasons[reason] = reasons.get(reason, 0) + 1
                continue
            assert obj is not None
            raw_timestamps.append(obj["timestamp"])
            records.append(InRecord(name, number, record.key, record.value, record.timestamp))
    # The six malformed lines, by what the ingest must call them.
    assert reasons == {"malformed": 2, "missing_field": 2, "bad_timestamp": 2}
    assert summary.malformed == {"bad_json": 2, "missing_key": 2, "bad_timestamp": 2}
    assert len(records) == summary.records == summary.lines - 6
    # Both timestamp forms occur, ISO instants with Z and with an offset.
    assert any(isinstance(t, int) for t in raw_timestamps)
    assert any(isinstance(t, str) and t.endswith("Z") for t in raw_timestamps)
    assert any(isinstance(t, str) and t[-6] in "+-" for t in raw_timestamps)
    # ~30 days of event time.
    stamps = [r.timestamp for r in records]
    assert max(stamps) - min(stamps) > 25 * 24 * HOUR

    store = ReferenceStore("versioned", history_retention_ms=summary.history_retention_ms)
    counts = store.run(records)
    assert counts.rejected["late"] == summary.late >= 3
    assert counts.accepted_out_of_order == summary.out_of_order
    assert counts.accepted_latest == summary.accepted_latest
    assert counts.tombstones == summary.tombstones
    assert counts.replaced_same_timestamp == summary.replaced_same_timestamp >= 2
    assert 0.08 <= summary.out_of_order / summary.records <= 0.12
    assert 0.003 <= summary.tombstones / summary.records <= 0.03
    expected = {k: v for k, v in summary.expected_rejected.items() if v}
    assert expected == {"late": summary.late, **reasons}
    assert store.stream_time[0] == summary.stream_time

    # The examples the demo prints are the store's real answers.
    assert len(summary.examples) == 3
    assert len({ex.key for ex in summary.examples}) == 3
    for ex in summary.examples:
        latest = store.latest(ex.key)
        assert latest is not None
        assert (latest.value, latest.timestamp) == (ex.latest.value, ex.latest.timestamp)
        outcome, version = store.as_of(ex.key, ex.as_of)
        assert outcome == "ok" and version is not None
        answer = ex.as_of_answer
        assert (version.value, version.timestamp, version.valid_to) == (
            answer.value, answer.timestamp, answer.valid_to)
        got = [(v.value, v.timestamp, v.valid_to)
               for v in store.range(ex.key, ex.versions_from, ex.versions_to)]
        assert got == [(r.value, r.timestamp, r.valid_to) for r in ex.versions]
        assert len(got) >= 2


def test_generate_is_deterministic(tmp_path: Path) -> None:
    first = generate(tmp_path / "a", keys=50, versions=6, files=2, fmt="jsonl", seed=3)
    second = generate(tmp_path / "b", keys=50, versions=6, files=2, fmt="jsonl", seed=3)
    other = generate(tmp_path / "c", keys=50, versions=6, files=2, fmt="jsonl", seed=4)
    for name in first.files:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert (tmp_path / "a" / first.files[0]).read_bytes() != (tmp_path / "c" / other.files[0]).read_bytes()
    assert first.lines == second.lines
    # Running again in place replaces the sample, and the summary round-trips.
    again = generate(tmp_path / "a", keys=50, versions=6, files=2, fmt="jsonl", seed=3)
    assert again == first
    assert SampleSummary.from_json((tmp_path / "a" / SUMMARY_FILE).read_text()) == first


def test_generate_refuses_a_directory_with_other_files(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    result = versiq("generate", "--out", str(tmp_path), "--keys", "10")
    assert result.returncode == 2
    assert "notes.txt" in result.stderr
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_generate_csv(tmp_path: Path) -> None:
    summary = generate(tmp_path, keys=80, versions=8, files=2, fmt="csv", seed=5)
    rows = []
    for name in summary.files:
        with open(tmp_path / name, encoding="utf-8", newline="") as handle:
            reader = csv.reader(handle)
            assert next(reader) == ["key", "value", "timestamp"]
            rows.extend(reader)
    assert len(rows) == summary.lines
    assert all(len(row) == 3 for row in rows)
    tombstones = sum(1 for row in rows if row[1] == "")
    assert tombstones == summary.tombstones
    bad_values = sum(1 for row in rows if row[1] and not _is_json(row[1]))
    assert bad_values == summary.expected_rejected["bad_value"] == 2
    assert sum(1 for row in rows if row[0] == "") == summary.expected_rejected["missing_field"] == 2


def test_generate_parquet(tmp_path: Path) -> None:
    summary = generate(tmp_path, keys=80, versions=8, files=2, fmt="parquet", seed=5)
    tables = [pq.read_table(tmp_path / name) for name in summary.files]
    assert all(t.column_names == ["key", "value", "timestamp"] for t in tables)
    rows = [row for t in tables for row in t.to_pylist()]
    assert len(rows) == summary.lines
    assert sum(1 for r in rows if r["key"] in (None, "")) == summary.expected_rejected["missing_field"]
    assert sum(1 for r in rows if r["timestamp"] < 0) == summary.expected_rejected["bad_timestamp"]
    assert sum(1 for r in rows if r["value"] is None) == summary.tombstones


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


def test_generate_rejects_bad_arguments(tmp_path: Path) -> None:
    result = versiq("generate", "--out", str(tmp_path / "x"), "--keys", "0")
    assert result.returncode == 2
    assert not os.path.exists(tmp_path / "x" / SUMMARY_FILE)


# ------------------------------------------------------------------------------ demo


def test_demo_drives_the_cli_contract(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    """The demo's ingest and serve calls are valid CLI invocations; it prints working curls."""
    from versiq.cli.demo import demo_command
    from versiq.cli.main import build_parser

    calls: list[list[str]] = []

    def fake_main(argv: list[str]) -> int:
        build_parser().parse_args(argv)  # SystemExit if the demo speaks a flag the CLI lacks
        calls.append(list(argv))
        if argv[0] == "ingest":
            report = Path(argv[argv.index("--report") + 1])
            report.write_text(json.dumps({"stores": {"prices": {
                "read": 10, "accepted_latest": 9, "accepted_out_of_order": 1, "rejected": {"late": 1}}}}))
        return 0

    args = build_parser().parse_args(["demo", "--data", str(tmp_path / "d"), "--warehouse",
                                      str(tmp_path / "w"), "--keys", "200", "--port", "9123"])
    # The ingest goes to the child runner (a process of its own), the server to main.
    assert demo_command(args, fake_main, child=fake_main) == 0
    summary = load_summary(tmp_path / "d")
    assert summary is not None and summary.keys == 200
    assert [c[0] for c in calls] == ["ingest", "serve"]
    ingest = calls[0]
    for flag, value in (("--warehouse", str(tmp_path / "w")), ("--store", "prices"),
                        ("--source", str(tmp_path / "d")), ("--history-retention", "7d")):
        assert ingest[ingest.index(flag) + 1] == value
    assert calls[1][calls[1].index("--port") + 1] == "9123"
    out = capsys.readouterr().out
    example = summary.examples[0]
    assert f"curl -s 'http://127.0.0.1:9123/v1/stores/prices/keys/{example.key}'" in out
    assert "?asOf=" in out and "/versions?from=" in out
    assert "Web console: http://127.0.0.1:9123/\n" in out
    assert f"http://127.0.0.1:9123/#/stores/prices/keys/{example.key}" in out
    assert "expect" not in out  # the fake ingest wrote no store: no answer is promised
    assert "versiq rejected --warehouse" in out and "..." not in out

    # A second run reuses the data (same summary) and ingests again (a no-op for the store).
    calls.clear()
    assert demo_command(args, fake_main, child=fake_main) == 0
    assert load_summary(tmp_path / "d") == summary
    assert [c[0] for c in calls] == ["ingest", "serve"]


def test_demo_on_a_busy_port_says_so_before_generating_or_ingesting(tmp_path: Path) -> None:
    """`versiq demo` whose port another server holds: exit 2 at once with one line that names a
    free port, before any data is generated or ingested."""
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = versiq("demo", "--data", str(tmp_path / "d"), "--warehouse", str(tmp_path / "w"),
                      "--port", str(port))
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"versiq demo: cannot serve on 127.0.0.1:{port}: the port is in use")
    free = int(re.search(r"port (\d+) is free: versiq demo --port \1", lines[0]).group(1))  # type: ignore[union-attr]
    assert free != port
    assert done.stdout == "" and not (tmp_path / "d").exists() and not (tmp_path / "w").exists()


@pytest.mark.slow
def test_demo_curls_answer_correctly(tmp_path: Path) -> None:
    """End to end: the demo's real ingest, then its printed curl URLs against a live server."""
    import socket

    import httpx

    from tests.support.processes import stop, wait_until_ready

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    data, warehouse = tmp_path / "data", tmp_path / "warehouse"
    result = versiq("demo", "--no-serve", "--keys", "300", "--data", str(data),
                    "--warehouse", str(warehouse), "--port", str(port), timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    # Quiet: Spark's start-up banner and WARN lines are not shown (ingest/log4j2.properties), and
    # the ingest's summary is printed once.
    assert not re.search(r"\bWARN\b|log4j2-defaults|Setting default log level", result.stderr), result.stderr
    assert result.stderr.count("store prices: read ") == 1, result.stderr
    summary = load_summary(data)
    assert summary is not None
    urls = re.findall(r"curl -s '([^']+)'", result.stdout)
    assert len(urls) == 4, result.stdout

    script = Path(sys.executable).with_name("versiq")
    entry = [str(script)] if script.exists() else [sys.executable, "-m", "versiq.cli"]
    server = subprocess.Popen([*entry, "serve", "--warehouse", str(warehouse), "--port", str(port)],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE)
    try:
        wait_until_ready(server, f"http://127.0.0.1:{port}")

        example = summary.examples[0]
        latest, as_of, versions = (httpx.get(url, timeout=10) for url in urls[:3])
        for response in (latest, as_of, versions):
            assert response.status_code == 200, response.text
        body = latest.json()
        assert body["key"] == example.key
        assert body["value"] == json.loads(example.latest.value)
        assert (body["timestamp"], body["validTo"]) == (example.latest.timestamp, None)
        price = re.escape(json.loads(example.latest.value, parse_float=str)["price"])
        assert re.search(rf'"price":\s*{price}[,}}]', latest.text), "number text not kept"
        body = as_of.json()
        assert body["value"] == json.loads(example.as_of_answer.value)
        assert (body["timestamp"], body["validTo"]) == (
            example.as_of_answer.timestamp, example.as_of_answer.valid_to)
        records = versions.json()["records"]
        assert [(json.dumps(r["value"]), r["timestamp"], r["validTo"]) for r in records] == [
            (json.dumps(json.loads(r.value)), r.timestamp, r.valid_to) for r in example.versions]
        stores = httpx.get(urls[3], timeout=10).json()["stores"]
        assert [s["name"] for s in stores] == ["prices"]
        assert stores[0]["streamTime"] == summary.stream_time
    finally:
        stop(server)


def test_keys_lists_what_the_http_listing_answers(tmp_path: Path) -> None:
    """Issue 16 item 8 (keys): ``versiq keys`` prints the records of GET /v1/stores/{store}/keys,
    one per line, every page, from one snapshot; bad options and unknown stores are exit 2."""
    import json

    from tests.support.storebuilder import StoreBuilder

    b = StoreBuilder(str(tmp_path), "s", history_retention_ms=1000)
    b.apply([("a", '"x"', 1), ("a", None, 5), ("a", "1", 10), ("b", None, 3)]
            + [(f"k{i:04d}", str(i), 20 + i) for i in range(1500)])
    out = versiq("keys", "--warehouse", str(tmp_path), "--store", "s")
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert lines[0] == {"key": "a", "value": 1, "timestamp": 10, "validTo": None}
    assert [r["key"] for r in lines] == ["a"] + [f"k{i:04d}" for i in range(1500)]  # past one page
    out = versiq("keys", "--warehouse", str(tmp_path), "--store", "s", "--as-of", "7", "--include-deleted",
                 "--end", "k")
    # horizon 1519 - 1000 = 519: as of 7, "a" (newest version at 10) is expired and left out;
    # "b"'s newest version, its tombstone at 3, still answers
    assert [json.loads(line) for line in out.stdout.splitlines()] == [
        {"key": "b", "timestamp": 3, "validTo": None, "deleted": True}]
    out = versiq("keys", "--warehouse", str(tmp_path), "--store", "s", "--prefix", "k000", "--start", "k0005")
    assert [json.loads(line)["key"] for line in out.stdout.splitlines()] == [f"k{i:04d}" for i in range(5, 10)]
    assert versiq("keys", "--warehouse", str(tmp_path), "--store", "nope").returncode == 2
    bad = versiq("keys", "--warehouse", str(tmp_path), "--store", "s", "--as-of", "soon")
    assert bad.returncode == 2 and "--as-of" in bad.stderr


def test_get_prints_the_http_answer_or_its_problem_with_exit_4(tmp_path: Path) -> None:
    """Issue 16 item 8 (get): ``versiq get`` prints the JSON of GET /v1/stores/{store}/keys/{key};
    without a value the 404's problem object and exit 4; ``--iso`` renders the times."""
    import json

    from tests.support.storebuilder import StoreBuilder

    b = StoreBuilder(str(tmp_path), "s", history_retention_ms=10 ** 9)
    b.apply([("a", '"x"', 1_000), ("a", None, 5_000), ("a", "1", 10_000)])
    wh = ["--warehouse", str(tmp_path), "--store", "s", "--key", "a"]
    out = versiq("get", *wh)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"key": "a", "value": 1, "timestamp": 10_000, "validTo": None, "snapshot": 0}
    out = versiq("get", *wh, "--as-of", "1970-01-01T00:00:02Z", "--iso")
    assert json.loads(out.stdout) == {"key": "a", "value": "x", "timestamp": "1970-01-01T00:00:01.000Z",
                                      "validTo": "1970-01-01T00:00:05.000Z", "snapshot": 0}
    gone = versiq("get", *wh, "--as-of", "6000")
    assert gone.returncode == 4, gone.stderr
    body = json.loads(gone.stdout)
    assert body["type"].endswith("/not-found") and body["deletedAt"] == 5_000 and body["status"] == 404
    assert versiq("get", *wh[:-2], "--key", "zz").returncode == 4
    assert versiq("get", "--warehouse", str(tmp_path), "--store", "nope", "--key", "a").returncode == 2
    both = versiq("get", *wh, "--snapshot", "0", "--as-of-system-time", "2100-01-01T00:00:00Z")
    assert both.returncode == 2 and "not both" in both.stderr
    assert versiq("get", *wh, "--snapshot", "7").returncode == 2


def test_unknown_stores_and_warehouses_are_named_one_way_with_a_suggestion(tmp_path: Path) -> None:
    """Every read command says "no store X in ...; did you mean Y?" (else the stores there), and a
    mistyped warehouse is named as such, not as a missing store; the HTTP API's detail is the
    same text (versiq.names.unknown_name)."""
    from tests.support.storebuilder import StoreBuilder
    from versiq.names import unknown_name

    StoreBuilder(str(tmp_path), "prices", history_retention_ms=10 ** 9).apply([("a", "1", 1_000)])
    wh = ["--warehouse", str(tmp_path)]
    for command in (["get", "--key", "a"], ["keys"], ["history"], ["rejected"]):
        out = versiq(command[0], *wh, "--store", "pricse", *command[1:])
        assert out.returncode == 2, (command, out.stderr)
        assert "no store 'pricse' in " in out.stderr and "did you mean 'prices'?" in out.stderr, (command, out.stderr)
        out = versiq(command[0], "--warehouse", str(tmp_path / "nowhere"), "--store", "prices", *command[1:])
        assert out.returncode == 2, (command, out.stderr)
        assert f"the warehouse {tmp_path / 'nowhere'} does not exist" in out.stderr, (command, out.stderr)
    out = versiq("keys", *wh, "--store", "zzz")
    assert out.returncode == 2 and "no store 'zzz' in the warehouse; its stores: prices" in out.stderr, out.stderr

    assert unknown_name("store", "x", []) == "no store 'x' in the warehouse; it has no stores"
    many = [f"s{i}" for i in range(20)]
    assert unknown_name("store", "zzzz", many) == "no store 'zzzz' in the warehouse (20 stores there)"
    assert unknown_name("stream", "clickz", ["clicks", "views"]).endswith("did you mean 'clicks'?")
