"""The refresh thread's watch pass (query/catalog.py, issue 17): a commit of a store or stream
already served is picked up as soon as its log file lands, without waiting for the full pass;
new stores still wait for the full pass. The full pass here is an hour away, so only the watch
can make the commits visible."""

from __future__ import annotations

import time

from tests.support.storebuilder import StoreBuilder
from versiq.query.api import StoreNotFound, VersionedKeyQuery
from versiq.query.engine import Engine


def _eventually(check, timeout: float = 10.0) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if check():
            return time.monotonic() - started
        time.sleep(0.01)
    raise AssertionError("not visible in time")


def test_a_commit_is_served_by_the_watch_pass_before_the_next_full_pass(tmp_path):
    wh = str(tmp_path / "wh")
    store = StoreBuilder(wh, "s", buckets=4)
    store.apply([("a", "1", 1)])
    engine = Engine(wh, refresh_interval_s=3600, watch_interval_s=0.05)
    engine.start()
    try:
        assert engine.get("s", VersionedKeyQuery("a")).record.value == "1"
        snapshot = store.apply([("a", "2", 2)])
        _eventually(lambda: engine.current_snapshot("s") == snapshot)
        assert engine.get("s", VersionedKeyQuery("a")).record.value == "2"
        assert engine.catalog.refresh_committed() == []  # nothing new since: nothing reloaded
        StoreBuilder(wh, "t").apply([("x", "9", 9)])
        time.sleep(0.5)
        try:
            engine.get("t", VersionedKeyQuery("x"))
            raise AssertionError("a new store is found by the full pass, not the watch")
        except StoreNotFound:
            pass
    finally:
        engine.close()


def test_a_commit_file_the_kernel_reports_starts_the_watch_pass_at_once(tmp_path):
    """A local warehouse: the kernel's notification of the commit file (``versiq.notify``) runs
    the watch pass; neither the watch interval nor the full pass (both an hour here) comes.
    Without notifications (``notified=False``) the same commit waits for them."""
    wh = str(tmp_path / "wh")
    store = StoreBuilder(wh, "s", buckets=4)
    store.apply([("a", "1", 1)])
    notified = Engine(wh, refresh_interval_s=3600, watch_interval_s=3600)
    polled = Engine(wh, refresh_interval_s=3600, watch_interval_s=3600, notified=False)
    notified.start()
    polled.start()
    try:
        time.sleep(0.5)  # the notifications' thread has set up its watches
        before = polled.current_snapshot("s")
        for value in ("2", "3"):
            snapshot = store.apply([("a", value, int(value))])
            _eventually(lambda snapshot=snapshot: notified.current_snapshot("s") == snapshot)
            assert notified.get("s", VersionedKeyQuery("a")).record.value == value
        time.sleep(0.5)
        assert polled.current_snapshot("s") == before
    finally:
        notified.close()
        polled.close()
