"""How ``versiq drop`` deletes a table (no Spark: tables written with delta-rs): at every step of
the deletion of a Delta log a reader opens the newest snapshot or nothing, never an older one;
a drop interrupted midway is completed by running it again; a writer waiting for the lock of a
dropped table locks the table's new lock file."""

from __future__ import annotations

import os
import threading
import time

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from tests.support.service import T0
from tests.support.storebuilder import StoreBuilder
from versiq import layout
from versiq.ingest.errors import LockTimeout, UsageError
from versiq.ingest.lifecycle import _VERSIONED, _log_order, drop
from versiq.ingest.store import writer_lock


def test_every_step_of_a_log_deletion_reads_the_newest_snapshot_or_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = str(tmp_path / "t")
    for i in range(7):
        write_deltalake(path, pa.table({"a": [i]}), mode="append")
        if i == 3:
            DeltaTable(path).create_checkpoint()
    newest = DeltaTable(path).version()
    log_dir = layout.delta_log(path)
    files = sorted((n for n in os.listdir(log_dir) if _VERSIONED.match(n)), key=_log_order)
    assert any(".checkpoint." in n for n in files)
    seen = []
    for name in files:
        os.remove(os.path.join(log_dir, name))
        try:
            seen.append(DeltaTable(path).version())
        except Exception:  # noqa: BLE001 - unreadable is what a half-deleted log must be
            seen.append(None)
    assert set(seen) <= {newest, None} and seen[-1] is None


def test_an_interrupted_drop_is_completed_by_running_it_again(tmp_path) -> None:  # type: ignore[no-untyped-def]
    warehouse = str(tmp_path)
    store = StoreBuilder(warehouse, "prices")
    for i in range(3):
        store.apply([("p", str(i), T0 + i)])
    log_dir = layout.delta_log(store.path)
    os.remove(os.path.join(log_dir, f"{0:020d}.json"))  # a drop killed after its first deletion
    with pytest.raises(Exception):  # noqa: B017 - no reader gets an older snapshot
        DeltaTable(store.path)
    assert drop(warehouse, "prices").dropped == ["prices"]
    assert not os.path.exists(store.path)
    with pytest.raises(UsageError, match="prices"):
        drop(warehouse, "prices")  # nothing left under that name


def test_a_writer_waiting_for_a_dropped_table_locks_its_new_lock_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = str(tmp_path / "prices")
    lock_file = os.path.join(path, layout.PRIVATE_DIR, layout.LOCK_FILE)
    locked, release = threading.Event(), threading.Event()

    def waiting_writer() -> None:
        with writer_lock(path, 30):
            locked.set()
            release.wait(30)

    with writer_lock(path, 5):  # the drop holds the lock ...
        thread = threading.Thread(target=waiting_writer)
        thread.start()
        time.sleep(0.5)  # ... while a writer waits for it, then unlinks the lock file it holds
        os.remove(lock_file)
        assert not locked.is_set()
    try:
        assert locked.wait(10)
        assert os.path.exists(lock_file)
        with pytest.raises(LockTimeout):  # the waiting writer holds the file every writer opens now
            with writer_lock(path, 0.5):
                pass
    finally:
        release.set()
        thread.join(10)
