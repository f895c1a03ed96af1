"""The web console in a real browser (Debian's headless Chromium driven by Playwright) against a
live ``versiq serve`` app on 127.0.0.1: pages load with no console error and ask no other host;
a key's timeline has one bar per version at the right place, tombstones marked, the horizon and
stream time drawn; the as-of cursor shows what the API answers; earlier snapshots, rejected
records, local time and bearer-token auth work. Screenshots go to each test's ``tmp_path``."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from deltalake import write_deltalake

from tests.support.browser import PageWatch
from tests.support.reference import ReferenceStore
from tests.support.service import HIST_VERSIONS, HOUR, T0, Warehouse, build_warehouse, live_server
from tests.support.storebuilder import StoreBuilder
from versiq import layout
from versiq.service.settings import Settings

#: The rejected rows written into ``prices/_rejected`` (run 1, which the store committed), and one
#: of run 2, an attempt the store never committed, which no reader may show.
_PLACE = {"row": None, "partition": None, "offset": None}
REJECTED = [
    {"run": 1, "source": "day-1.jsonl", "line": 4, **_PLACE, "reason": "malformed", "raw": '{"key": "p-9", "value": ',
     "detail": "not valid JSON", "ingested_at": "2023-11-15T08:00:00.000Z"},
    {"run": 1, "source": "day-1.jsonl", "line": 9, **_PLACE, "reason": "late",
     "raw": '{"key":"p-1","value":1,"timestamp":1}', "detail": "older than the horizon",
     "ingested_at": "2023-11-15T08:00:00.000Z"},
    {"run": 2, "source": "day-2.jsonl", "line": 1, **_PLACE, "reason": "malformed", "raw": "uncommitted",
     "detail": "an unfinished attempt", "ingested_at": "2023-11-15T09:00:00.000Z"},
]
#: A value a double cannot hold (a 20-digit integer, a trailing zero) and long enough to wrap.
BIG = ('{"id":12345678901234567890,"price":1.50,"tags":[' +
       ",".join(f'"tag-{i:03d}"' for i in range(60)) + '],"more":' + "1" * 30 + "}")
#: A rejected raw text longer than a listing shows (4,096 characters).
LONG_RAW = '{"key": "o-9", "value": "' + "x" * 10_000


@pytest.fixture(scope="module")
def console_warehouse(tmp_path_factory: pytest.TempPathFactory) -> Warehouse:
    """The service tests' warehouse, plus a second snapshot of ``live`` (key ``k`` rewritten) and
    rejected records of ``prices``."""
    warehouse = build_warehouse(str(tmp_path_factory.mktemp("console-wh")))
    warehouse.live.apply([("k", '"late-news"', T0 + 7), ("k", None, T0 + 50)])
    orders = StoreBuilder(warehouse.path, "orders", partitions=2, history_retention_ms=HOUR)
    orders.apply([(f"o-{i}", str(i), T0 + i * HOUR) for i in range(8)] + [("big", BIG, T0 + 7 * HOUR)])
    write_deltalake(str(Path(warehouse.path, "prices", layout.REJECTED_DIR)),
                    _rejected_table(), mode="append")
    write_deltalake(str(Path(warehouse.path, "orders", layout.REJECTED_DIR)),
                    _rejected_table([{**REJECTED[0], "raw": LONG_RAW}]), mode="append")
    return warehouse


def _rejected_table(rows: list[dict[str, Any]] = REJECTED) -> Any:
    import pyarrow as pa

    return pa.Table.from_pylist(rows, schema=layout.REJECTED_SCHEMA)


@pytest.fixture(scope="module")
def console_url(console_warehouse: Warehouse) -> Iterator[str]:
    with live_server(Settings(warehouse=console_warehouse.path, refresh_interval_s=3600)) as url:
        yield url


@pytest.fixture
def open_page(browser, console_url: str, tmp_path: Path):
    """``open_page(hash, timezone=None)`` -> (page, watch); the test's page is screenshotted into
    ``tmp_path`` at the end and must have logged no error and asked no other host."""
    contexts, watches = [], []

    def open_(fragment: str, timezone: str | None = None, url: str = console_url):
        context = browser.new_context(viewport={"width": 1400, "height": 900}, timezone_id=timezone)
        contexts.append(context)
        page = context.new_page()
        watch = PageWatch.attach(page)
        watches.append((watch, url))
        page.goto(f"{url}/{fragment}")
        page.wait_for_selector("body[data-ready]")
        return page, watch

    yield open_
    for i, ((watch, url), context) in enumerate(zip(watches, contexts, strict=True)):
        watch.page.screenshot(path=str(tmp_path / f"console-{i}.png"), full_page=True)
        context.close()
        assert watch.errors == [], watch.errors
        assert watch.foreign_requests(url) == [], watch.foreign_requests(url)


def _api(url: str, path: str, **params: Any) -> Any:
    response = httpx.get(url + path, params=params, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def _versions(url: str, store: str, key: str, **params: Any) -> tuple[dict, list[dict]]:
    """Every version of ``key`` (tombstones included) as the API lists them, and the first page."""
    path = f"/v1/stores/{store}/keys/{quote(key, safe='')}/versions"
    first = page = _api(url, path, includeDeleted="true", pageSize=1000, **params)
    records = list(page["records"])
    while page["nextPageToken"]:
        page = _api(url, path, includeDeleted="true", pageSize=1000, pageToken=page["nextPageToken"])
        records += page["records"]
    return first, records


def _bars(page) -> list[dict[str, Any]]:
    return page.eval_on_selector_all("#timeline rect.bar", """els => els.map(e => ({
        key: e.dataset.key, from: Number(e.dataset.validFrom),
        to: e.dataset.validTo === "" ? null : Number(e.dataset.validTo), deleted: e.dataset.deleted === "true",
        x: Number(e.getAttribute("x")), width: Number(e.getAttribute("width"))}))""")


def _cursor_answer(page, at: int) -> dict[str, Any]:
    """What the value panel shows once the cursor's answer for ``at`` has arrived."""
    page.wait_for_selector(f'#cursor-value[data-state="done"][data-at="{at}"]')
    value = page.query_selector("#cursor-json")
    problem = page.query_selector("#cursor-value .error")
    return {"value": None if value is None else json.loads(value.get_attribute("data-value")),
            "problem": None if problem is None else problem.get_attribute("data-problem"),
            "text": page.inner_text("#cursor-value")}


def test_overview_lists_every_store_and_stream_with_times_and_rejections(open_page, console_url):
    page, _ = open_page("")
    stores = _api(console_url, "/v1/stores")["stores"]
    assert page.eval_on_selector_all("#stores tr[data-store]", "els => els.map(e => e.dataset.store)") == \
        [s["name"] for s in stores]
    streams = _api(console_url, "/v1/streams")["streams"]
    assert page.eval_on_selector_all("#streams tr[data-stream]", "els => els.map(e => e.dataset.stream)") == \
        [s["name"] for s in streams]
    prices = page.locator('#stores tr[data-store="prices"]')
    info = next(s for s in stores if s["name"] == "prices")
    assert "1h" in prices.inner_text()
    # RFC 3339 in UTC by default, epoch ms on hover.
    stream_time = prices.locator(f'time[data-ms="{info["streamTime"]}"]')
    assert stream_time.inner_text() == "2023-11-15T08:13:20.000Z"
    assert stream_time.get_attribute("title") == f"{info['streamTime']} (epoch ms)"
    assert json.loads(prices.locator("[data-rejected]").get_attribute("data-rejected")) == {"late": 1, "malformed": 1}
    assert "prices" in page.locator('#stores tr[data-store="expensive"]').inner_text()  # provenance


def test_a_key_timeline_draws_each_version_as_a_bar_at_its_place(open_page, console_url):
    page, _ = open_page("#/stores/prices/keys/p-1")
    first, versions = _versions(console_url, "prices", "p-1")
    bars = _bars(page)
    assert [(b["key"], b["from"], b["to"], b["deleted"]) for b in bars] == \
        [("p-1", T0, T0 + 9 * HOUR + 500, False), ("p-1", T0 + 9 * HOUR + 500, None, False)]
    assert [(b["from"], b["to"]) for b in bars] == [(r["timestamp"], r["validTo"]) for r in versions]
    lo, hi = (float(page.get_attribute("#timeline", name)) for name in ("data-lo", "data-hi"))
    width = 1000

    def x(t: float) -> float:
        return (t - lo) / (hi - lo) * width

    for bar in bars:
        assert bar["x"] == pytest.approx(x(bar["from"]), abs=0.01)
        assert bar["x"] + bar["width"] == pytest.approx(x(bar["to"] if bar["to"] is not None else hi), abs=0.01)
    assert int(page.get_attribute("#timeline line.horizon", "data-horizon")) == first["horizon"] == T0 + 9 * HOUR
    assert int(page.get_attribute("#timeline line.stream-time", "data-stream-time")) == T0 + 10 * HOUR
    assert page.locator("#versions tbody tr").count() == 2


def test_stream_time_and_horizon_per_partition(open_page, console_url):
    page, _ = open_page("")
    info = _api(console_url, "/v1/stores/orders")
    assert len(info["partitionStreamTimes"]) == 2
    row = page.locator('#stores tr[data-store="orders"]')
    shown = row.locator("details.partitions").first.locator("time")
    assert [int(t) for t in shown.evaluate_all("els => els.map(e => e.dataset.ms)")] == \
        [p["streamTime"] for p in info["partitionStreamTimes"]]
    # A key's timeline draws the stream time and horizon of the key's own partition.
    by_partition = {p["partition"]: p for p in info["partitionStreamTimes"]}
    model = ReferenceStore("versioned", HOUR, 2)
    first_of = {model.partition_of_key(f"o-{i}"): f"o-{i}" for i in reversed(range(8))}
    assert sorted(first_of) == [0, 1] and by_partition[0]["streamTime"] != by_partition[1]["streamTime"]
    for partition, key in first_of.items():
        page, _ = open_page(f"#/stores/orders/keys/{key}")
        assert int(page.get_attribute("#timeline line.stream-time", "data-stream-time")) == \
            by_partition[partition]["streamTime"], key
        assert int(page.get_attribute("#timeline line.horizon", "data-horizon")) == \
            by_partition[partition]["oldestQueryableTimestamp"], key


def test_tombstones_and_long_histories(open_page, console_url):
    page, _ = open_page("#/stores/prices/keys/deleted")
    assert [(b["from"], b["to"], b["deleted"]) for b in _bars(page)] == \
        [(T0 + 9 * HOUR + 100, T0 + 9 * HOUR + 200, False), (T0 + 9 * HOUR + 200, None, True)]
    assert page.locator('#versions tr[data-deleted="true"]').count() == 1
    page, _ = open_page("#/stores/prices/keys/hist")
    _first, versions = _versions(console_url, "prices", "hist")
    bars = _bars(page)
    assert len(bars) == len(versions) == HIST_VERSIONS
    assert [b["from"] for b in bars] == sorted(b["from"] for b in bars)


def test_the_cursor_shows_the_value_the_api_answers_at_its_time(open_page, console_url):
    page, _ = open_page("#/stores/prices/keys/p-1")
    # Typed as RFC 3339: inside the first version.
    at = T0 + 9 * HOUR + 499
    page.fill("#cursor-time", "2023-11-15T07:13:20.499Z")
    page.click("#cursor-go")
    shown = _cursor_answer(page, at)
    assert shown["value"] == {"price": 1.5, "currency": "EUR"}
    assert shown["value"] == _api(console_url, "/v1/stores/prices/keys/p-1", asOf=at)["value"]
    assert int(page.get_attribute("#cursor-line", "data-cursor")) == at
    assert page.locator("#versions tr.at-cursor").get_attribute("data-valid-from") == str(T0)
    # Clicked on the timeline: the middle of the second bar.
    second = page.locator("#timeline rect.bar").nth(1)
    box = second.bounding_box()
    assert box is not None
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    at = int(page.get_attribute("#cursor-line", "data-cursor"))
    assert at > T0 + 9 * HOUR + 500
    assert _cursor_answer(page, at)["value"] == {"price": 2.0, "currency": "EUR"}
    # Before the horizon: the API's expired problem, shown as such.
    page.fill("#cursor-time", str(T0 + HOUR))
    page.press("#cursor-time", "Enter")
    shown = _cursor_answer(page, T0 + HOUR)
    assert shown["problem"] == "expired" and shown["value"] is None


def test_the_cursor_on_a_tombstone_says_when_the_key_was_deleted(open_page):
    page, _ = open_page(f"#/stores/prices/keys/deleted?at={T0 + 9 * HOUR + 250}")
    shown = _cursor_answer(page, T0 + 9 * HOUR + 250)
    assert shown["problem"] == "not-found" and "deleted" in shown["text"]


def test_an_earlier_snapshot_shows_the_history_as_it_was(open_page, console_url):
    page, _ = open_page("#/stores/live/keys/k")
    now = _bars(page)
    _first, current = _versions(console_url, "live", "k")
    assert [(b["from"], b["to"], b["deleted"]) for b in now] == \
        [(r["timestamp"], r["validTo"], bool(r.get("deleted"))) for r in current]
    assert any(b["deleted"] for b in now) and T0 + 7 in [b["from"] for b in now]
    assert page.get_attribute("#timeline", "data-snapshot") == "1"
    page.select_option("#snapshot", "0")
    page.wait_for_selector('#timeline[data-snapshot="0"]')
    before = _bars(page)
    _first, old = _versions(console_url, "live", "k", snapshot=0)
    assert [(b["from"], b["to"]) for b in before] == [(r["timestamp"], r["validTo"]) for r in old]
    assert len(before) == 50 and not any(b["deleted"] for b in before)


def test_deleted_keys_are_counted_apart_and_listed_only_on_request(open_page, console_url: str):
    """A store's deleted keys (latest version a tombstone, e.g. a filter table's rows that stopped
    passing) are not keys with a value: the store page counts the two apart, its key list hides
    the deleted ones until the toggle shows them, tagged "deleted"."""
    every = _api(console_url, "/v1/stores/prices/keys", includeDeleted="true", pageSize=1000)["records"]
    deleted = sorted(r["key"] for r in every if r.get("deleted"))
    live = sorted(r["key"] for r in every if not r.get("deleted"))
    assert deleted and live and len(every) < 50  # one page of the console's list holds them all
    page, _ = open_page("#/stores/prices")
    counts = page.locator("#key-counts")
    assert [counts.get_attribute(f"data-{n}") for n in ("live", "deleted")] == [str(len(live)), str(len(deleted))]
    assert f"{len(live)} keys with a value, {len(deleted)} deleted key" in counts.inner_text()
    listed = "() => [...document.querySelectorAll('#key-results li')].map(e => e.dataset.key).sort().join('\\n')"
    page.wait_for_function(f"want => ({listed})() === want", arg="\n".join(live))
    assert page.locator("#key-results li[data-deleted]").count() == 0
    page.check("#show-deleted")
    page.wait_for_function(f"want => ({listed})() === want", arg="\n".join(sorted(live + deleted)))
    shown = page.eval_on_selector_all("#key-results li[data-deleted] .tag.deleted", "els => els.length")
    assert shown == len(deleted)
    page.uncheck("#show-deleted")
    page.wait_for_function(f"want => ({listed})() === want", arg="\n".join(live))


def test_keys_are_found_by_prefix_and_odd_keys_open(open_page):
    page, _ = open_page("#/stores/prices")
    page.fill("#key-prefix", "p-")
    page.wait_for_function(
        "() => [...document.querySelectorAll('#key-results li')].map(e => e.dataset.key).join() === 'p-1'")
    page.click('#key-results li[data-key="p-1"] a')
    page.wait_for_selector("#timeline rect.bar")
    assert len(_bars(page)) == 2
    for key in ("a/b", "100%", "what?x=1&y=2", "ünïcødé/🎉", "with space"):
        page, _ = open_page(f"#/stores/prices/keys/{quote(key, safe='')}")
        bars = _bars(page)
        assert [b["key"] for b in bars] == [key], key
    # Browsers resolve "." and ".." path segments, encoded or not: the page says so and how to read it.
    page, _ = open_page("#/stores/prices/keys/..")
    assert "curl --path-as-is" in page.inner_text("#dot-key")


def test_rejected_records_by_reason_with_the_raw_text(open_page):
    page, _ = open_page("#/stores/prices/rejected")
    rows = page.eval_on_selector_all("#rejected tbody tr", "els => els.map(e => e.dataset.reason)")
    assert rows == ["malformed", "late"]  # run 2 was never committed
    assert '{"key": "p-9", "value": ' in page.inner_text("#rejected")
    page.select_option("#reason", "late")
    page.wait_for_function("() => document.querySelectorAll('#rejected tbody tr').length === 1")
    assert page.eval_on_selector_all("#rejected tbody tr", "els => els.map(e => e.dataset.reason)") == ["late"]


def test_values_are_shown_as_stored_and_long_ones_wrap_between_tokens(open_page, console_url):
    stored = _api(console_url, "/v1/stores/orders/keys/big")
    assert stored["value"]["id"] == 12345678901234567890  # the API sends the stored text
    page, _ = open_page("#/stores/orders/keys/big")
    shown = page.locator("#cursor-json")
    page.wait_for_selector('#cursor-value[data-state="done"]')
    assert shown.get_attribute("data-value") == BIG
    text = shown.inner_text()
    assert '"id": 12345678901234567890' in text and '"price": 1.50' in text and "1" * 30 in text
    cell = page.locator("#versions tbody pre").first
    assert cell.inner_text().replace("\n", "") == BIG
    assert cell.locator("wbr").count() == BIG.count(",") + BIG.count(":")
    # Wrapped inside its column, every line ends after a "," or ":" (never inside a token).
    lines = cell.evaluate("""pre => {
        const range = document.createRange(), tops = new Map();
        for (const node of pre.childNodes) {
          if (node.nodeType !== Node.TEXT_NODE) continue;
          for (let i = 0; i < node.length; i++) {
            range.setStart(node, i); range.setEnd(node, i + 1);
            const top = Math.round(range.getBoundingClientRect().top);
            tops.set(top, (tops.get(top) || "") + node.data[i]);
          }
        }
        return [...tops.values()];
    }""")
    assert len(lines) > 1 and "".join(lines) == BIG
    assert all(line[-1] in ",:" for line in lines[:-1]), lines
    assert cell.evaluate("pre => pre.scrollWidth <= pre.clientWidth + 1")
    page, _ = open_page("#/stores/orders")
    page.fill("#key-prefix", "bi")
    page.wait_for_selector('#key-results li[data-key="big"]')
    assert BIG[:60] in page.inner_text('#key-results li[data-key="big"]')


def test_the_horizon_note_is_shown_only_for_a_history_that_reaches_it(open_page):
    page, _ = open_page("#/stores/prices/keys/p-1")  # its first version began before the horizon
    assert "retention horizon" in page.inner_text("#key-summary")
    page, _ = open_page("#/stores/prices/keys/deleted")  # all of it after the horizon
    assert "horizon" not in page.inner_text("#key-summary")


def test_a_long_rejected_raw_text_is_cut_and_shown_whole_on_demand(open_page):
    page, _ = open_page("#/stores/orders/rejected")
    raw = page.locator("#rejected pre.raw")
    assert raw.inner_text() == LONG_RAW[:4096]
    button = page.locator("#rejected button.raw-all")
    assert "10,025 characters" in button.inner_text()
    button.click()
    page.wait_for_selector('#rejected pre.raw[data-whole="true"]')
    assert raw.inner_text() == LONG_RAW and page.locator("#rejected button.raw-all").count() == 0


def test_times_switch_to_local_rfc3339(open_page):
    page, _ = open_page("", timezone="Asia/Kolkata")
    page.select_option("#zone", "local")
    page.wait_for_function("() => document.querySelector('#stores time').textContent.endsWith('+05:30')")
    stream_time = page.locator('#stores tr[data-store="prices"] time').first
    assert stream_time.inner_text() == "2023-11-15T13:43:20.000+05:30"


def test_with_auth_on_the_console_asks_for_a_token_and_uses_it(browser, console_warehouse, tmp_path):
    settings = Settings(warehouse=console_warehouse.path, refresh_interval_s=3600, api_tokens=("s3cret",))
    with live_server(settings) as url:
        context = browser.new_context()
        page = context.new_page()
        watch = PageWatch.attach(page)
        page.goto(url + "/")
        page.wait_for_selector("dialog#auth[open]")
        page.fill("#auth-token", "s3cret")
        page.click("#auth-form button[type=submit]")
        page.wait_for_selector('#stores tr[data-store="prices"]')
        page.screenshot(path=str(tmp_path / "console-auth.png"))
        # The only errors: the browser's report of the first, unauthenticated 401s.
        assert all("401" in e for e in watch.errors), watch.errors
        assert watch.foreign_requests(url) == []
        context.close()


def test_the_console_is_three_files_of_the_package_served_with_their_types(console_url):
    page = httpx.get(console_url + "/", timeout=30)
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    assert "connect-src 'self'" in page.headers["content-security-policy"]
    assert {httpx.get(console_url + f"/console/console.{ext}", timeout=30).headers["content-type"]
            for ext in ("js", "css")} == {"text/javascript; charset=utf-8", "text/css; charset=utf-8"}
    for path in ("/", "/console/console.js", "/console/console.css"):
        text = httpx.get(console_url + path, timeout=30).text
        # No address of another host anywhere (the SVG namespace is a name, never fetched).
        assert [u for u in re.findall(r"https?://[^\s'\"`)]+", text) if u != "http://www.w3.org/2000/svg"] == [], path
