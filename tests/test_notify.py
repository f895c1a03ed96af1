"""``versiq.notify``: the kernel's file notifications as one thing to wait on (real inotify
through watchfiles, real files)."""

from __future__ import annotations

import logging
import os
import time

from versiq.notify import FileChanges


def test_a_change_wakes_the_wait_and_one_the_filter_drops_does_not(tmp_path) -> None:
    changes = FileChanges([str(tmp_path)], "the test folder", keep=lambda path: path.endswith(".json"))
    try:
        assert changes.wait(10)  # the first wake-up: the watches are set up
        (tmp_path / "ignored.tmp").write_text("x")
        assert not changes.wait(0.5)
        (tmp_path / "sub").mkdir()
        time.sleep(0.3)  # the watch of the new folder is added
        started = time.monotonic()
        (tmp_path / "sub" / "1.json.tmp").write_text("{}")
        os.rename(tmp_path / "sub" / "1.json.tmp", tmp_path / "sub" / "1.json")  # in a folder made after the start
        assert changes.wait(10)
        assert time.monotonic() - started < 5
        assert changes.notified
    finally:
        changes.close()
    assert not changes.notified


def test_where_the_kernel_cannot_notify_it_says_so_once_and_the_caller_polls(tmp_path, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="versiq.notify"):
        changes = FileChanges([str(tmp_path / "missing")], "the missing folder")
        try:
            deadline = time.monotonic() + 10
            while changes.notified and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not changes.notified
            changes.wait(0)  # the wake-up that said so
            assert not changes.wait(0.2)  # a timeout now: the caller polls at its own interval
        finally:
            changes.close()
    [record] = [r for r in caplog.records if r.name == "versiq.notify"]
    message = record.getMessage()
    assert "no file notifications for the missing folder" in message and "polling instead" in message
