"""A new user's first hour (issue 18, "done when"): ``versiq demo`` generates, ingests (in a child
process whose Spark JVM has ended by the time the demo serves) and serves; the console URL it
prints opens in a real browser (Debian's Chromium, Playwright), the demo key is found by its
prefix, its timeline is drawn, the as-of cursor moved to the curl example's time reads the value
the curl prints, and every answer the demo promised is the one the server gives; every ``curl``
example of README.md and docs/http-api.md answers on the demo (one demo run serves both tests)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.support.browser import PageWatch
from tests.support.doc_examples import curl_examples, run_curl
from tests.support.processes import stop, wait_until_ready
from tests.support.service import free_port
from versiq.cli.sample import load_summary
from versiq.timestamps import format_timestamp, parse_timestamp

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc: parents of all processes)."""
    parent_of: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parent_of[int(entry)] = int(fields[1])
    found, frontier = [], [pid]
    while frontier:
        current = frontier.pop()
        children = [p for p, parent in parent_of.items() if parent == current]
        found += children
        frontier += children
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _read_until(stream, pattern: str, deadline: float, seen: list[str]) -> None:
    while time.monotonic() < deadline:
        line = stream.readline()
        if not line:
            raise AssertionError("the demo's output ended early:\n" + "".join(seen))
        seen.append(line)
        if re.search(pattern, line):
            return
    raise AssertionError("timed out reading the demo's output:\n" + "".join(seen))


@dataclass(frozen=True)
class Demo:
    """A running ``versiq demo``: its address, what it printed, its process and folders."""

    base: str
    text: str
    process: subprocess.Popen
    data: Path
    folder: Path


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    """One ``versiq demo`` of the default size (what ``make demo`` runs, whose keys and times the
    docs quote; its ingest takes a few seconds more than a tenth of it) on a free port of
    127.0.0.1, serving once it has printed its examples (paid once for the module)."""
    tmp_path = tmp_path_factory.mktemp("first-hour")
    port = free_port()
    data, warehouse = tmp_path / "data", tmp_path / "warehouse"
    script = Path(sys.executable).with_name("versiq")
    entry = [str(script)] if script.exists() else [sys.executable, "-m", "versiq.cli"]
    with open(tmp_path / "demo.stderr", "wb") as stderr:  # the child holds its own copy of the file
        process = subprocess.Popen([*entry, "demo", "--data", str(data), "--warehouse",
                                    str(warehouse), "--port", str(port)], stdin=subprocess.DEVNULL,
                                   stdout=subprocess.PIPE, stderr=stderr, text=True, bufsize=1)
    out: list[str] = []
    try:
        assert process.stdout is not None
        _read_until(process.stdout, r"curl -s '.*/v1/stores'$", time.monotonic() + 600, out)
        text = "".join(out)
        base = f"http://127.0.0.1:{port}"
        wait_until_ready(process, base, why=lambda: text + (tmp_path / "demo.stderr").read_text())
        yield Demo(base, text, process, data, tmp_path)
    finally:
        stop(process)
        if process.stdout is not None:
            process.stdout.close()


def test_demo_then_console_then_cursor_reads_what_curl_prints(browser, demo: Demo) -> None:
    text, base = demo.text, demo.base
    # Serving, and no JVM left: the ingest ran in a process that has ended.
    java = [p for p in _descendants(demo.process.pid) if "java" in _cmdline(p)]
    assert java == [], [_cmdline(p) for p in java]
    assert text.count("store prices:") <= 1  # one summary per run

    summary = load_summary(demo.data)
    assert summary is not None
    example = summary.examples[0]
    assert f"Web console: {base}/\n" in text
    urls = re.findall(r"curl -s '([^']+)'", text)
    latest_url, as_of_url, versions_url = urls[:3]

    # Every promise printed beside a curl is what the server answers (prices as the number text
    # the API keeps: 329.60, not 329.6).
    latest = json.loads(httpx.get(latest_url, timeout=10).text, parse_float=str)
    promised = re.search(r"latest value of \S+ \(expect price (\S+), timestamp (\d+) \(", text)
    assert promised is not None, text
    assert (promised[1], int(promised[2])) == (latest["value"]["price"], latest["timestamp"])
    as_of_text = httpx.get(as_of_url, timeout=10).text
    as_of, as_of_price = json.loads(as_of_text), json.loads(as_of_text, parse_float=str)["value"]["price"]
    promised = re.search(r"as of \S+ \(expect price (\S+), timestamp (\d+) \([^)]*\), validTo (\d+) ", text)
    assert promised is not None, text
    assert (promised[1], int(promised[2]), int(promised[3])) == (as_of_price, as_of["timestamp"], as_of["validTo"])
    versions = httpx.get(versions_url, timeout=10).json()["records"]
    assert f"(expect {len(versions)} record" in text

    # The console: find the key by its prefix, open its timeline, move the cursor.
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    watch = PageWatch.attach(page)
    page.goto(f"{base}/")
    page.wait_for_selector('#stores tr[data-store="prices"]')
    page.click('#stores tr[data-store="prices"] a')
    page.wait_for_selector("#key-prefix")
    page.fill("#key-prefix", example.key)
    page.wait_for_selector(f'#key-results li[data-key="{example.key}"]')
    page.click(f'#key-results li[data-key="{example.key}"] a')
    page.wait_for_selector("#timeline rect.bar")
    bars = page.eval_on_selector_all("#timeline rect.bar", "els => els.map(e => Number(e.dataset.validFrom))")
    history = httpx.get(versions_url.split("?")[0], params={"includeDeleted": "true", "pageSize": 1000},
                        timeout=10).json()["records"]
    assert bars == [r["timestamp"] for r in history]
    at = parse_timestamp(re.search(r"\?asOf=([^']+)'", as_of_url + "'")[1])
    page.fill("#cursor-time", str(at))
    page.press("#cursor-time", "Enter")
    page.wait_for_selector(f'#cursor-value[data-state="done"][data-at="{at}"]')
    shown = json.loads(page.get_attribute("#cursor-json", "data-value"))
    assert shown == as_of["value"]
    page.screenshot(path=str(demo.folder / "first-hour.png"), full_page=True)
    assert watch.errors == [] and watch.foreign_requests(base) == []
    context.close()


def test_every_curl_example_of_the_docs_answers_on_the_demo(demo: Demo, tmp_path: Path) -> None:
    served = load_summary(demo.data)
    assert served is not None
    first = served.examples[0]
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    # What the README promises for its key is what the demo's store holds.
    assert (f'`{{"key":"{first.key}","value":{first.latest.value},"timestamp":{first.latest.timestamp},'
            f'"validTo":null,"snapshot":0}}`') in readme
    assert f"price {json.loads(first.as_of_answer.value)['price']:.2f}" in readme
    assert f"the {len(first.versions)} versions valid in that range" in readme

    port = demo.base.rsplit(":", 1)[1]
    examples = [*curl_examples(ROOT / "README.md"), *curl_examples(ROOT / "docs" / "http-api.md")]
    readme_examples = [e for e in examples if e.source.startswith("README.md")]
    assert len(readme_examples) >= 3 and all(e.needs is None for e in readme_examples)
    quoted = [first.key, *(format_timestamp(t) for t in (first.as_of, first.versions_from, first.versions_to))]
    assert all(any(text in e.command for e in readme_examples) for text in quoted), quoted

    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"key": [served.examples[0].key, "nope"], "asOf": [served.examples[0].as_of, None]}),
                   tmp_path / "pairs.parquet")  # the file the Parquet lookup example uploads
    failed, skipped = [], []
    for example in examples:
        if example.needs is not None:
            skipped.append((example.source, example.needs))
            continue
        command = example.command.replace("127.0.0.1:8080", f"127.0.0.1:{port}")
        answer = run_curl(command, tmp_path)
        if not 200 <= answer.status_code < 300:
            failed.append(f"{example.source}: {answer.status_code} {answer.text[:300]}\n  {command}")
    assert failed == [], "\n".join(failed)
    assert {needs for _, needs in skipped} == {"a stream"}, skipped  # and nothing else is left out
    assert pq.read_table(tmp_path / "answers.parquet").num_rows == 2

