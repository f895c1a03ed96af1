"""The local writer lock's record of its holder and the JVM that writes for it
(``versiq.ingest.holder``): a writer that takes the lock from a holder that died ends that
holder's JVM, and only that one. Real processes stand for the dead holder and its JVM."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator

import pytest

from versiq.ingest.holder import Holder, start_time
from versiq.ingest.spark import driver_jvm_pid
from versiq.ingest.store import check_still_writer, writer_lock
from versiq.layout import LOCK_FILE, PRIVATE_DIR


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A process standing for a JVM (or a holder's Python process) that runs until killed."""
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


def _dead_process() -> tuple[int, str]:
    proc = subprocess.Popen(["sleep", "60"])
    start = start_time(proc.pid)
    assert start is not None
    proc.kill()
    proc.wait()
    return proc.pid, start


def _leave_record(store: str, holder: Holder) -> str:
    lock = os.path.join(store, PRIVATE_DIR, LOCK_FILE)
    os.makedirs(os.path.dirname(lock), exist_ok=True)
    with open(lock, "w", encoding="utf-8") as handle:
        handle.write(holder.encode())
    return lock


def _holder(pid: int, start: str | None, jvm: int, jvm_start: str | None) -> Holder:
    return Holder(pid=pid, host=socket.gethostname(), since="2026-01-01T00:00:00Z", start=start, jvm=jvm,
                  jvm_start=jvm_start)


def test_the_jvm_of_a_holder_that_died_is_ended_before_the_next_writer_goes_on(tmp_path, sleeper):
    pid, start = _dead_process()
    lock = _leave_record(str(tmp_path), _holder(pid, start, sleeper.pid, start_time(sleeper.pid)))
    with writer_lock(str(tmp_path), 5):
        assert start_time(sleeper.pid) is None  # killed (a zombie of this test until reaped)
        with open(lock, encoding="utf-8") as handle:
            me = Holder.decode(handle.read())
        assert me is not None and me.pid == os.getpid() and me.alive() and me.jvm is None
    assert sleeper.wait(timeout=5) < 0
    with open(lock, encoding="utf-8") as handle:
        assert handle.read() == ""  # released: nothing for the next writer to end


@pytest.mark.parametrize("case", ["holder alive", "jvm pid reused", "another host", "no jvm start"])
def test_a_process_that_is_not_a_dead_holders_jvm_is_left_alone(tmp_path, sleeper, case):
    dead, dead_start = _dead_process()
    jvm, jvm_start = sleeper.pid, start_time(sleeper.pid)
    live = subprocess.Popen(["sleep", "60"])  # a holder that let go without emptying the file
    try:
        holder = {
            "holder alive": _holder(live.pid, start_time(live.pid), jvm, jvm_start),
            "jvm pid reused": _holder(dead, dead_start, jvm, "1"),
            "another host": Holder(dead, "elsewhere.invalid", "", dead_start, jvm, jvm_start),
            "no jvm start": _holder(dead, dead_start, jvm, None),  # written where /proc could not tell
        }[case]
        _leave_record(str(tmp_path), holder)
        with writer_lock(str(tmp_path), 5):
            pass
    finally:
        live.kill()
        live.wait()
    assert sleeper.poll() is None


def test_the_record_names_the_jvm_before_the_first_write(spark, tmp_path):
    lock = os.path.join(str(tmp_path), PRIVATE_DIR, LOCK_FILE)
    with writer_lock(str(tmp_path), 5):
        check_still_writer(str(tmp_path))
        with open(lock, encoding="utf-8") as handle:
            me = Holder.decode(handle.read())
        jvm = driver_jvm_pid()
        assert me is not None and jvm is not None and jvm != os.getpid()
        assert (me.jvm, me.jvm_start) == (jvm, start_time(jvm))
        assert os.readlink(f"/proc/{jvm}/exe").endswith("/java")


def test_a_record_round_trips_and_an_old_or_empty_file_names_no_jvm():
    holder = _holder(12, "345", 67, "890")
    assert Holder.decode(holder.encode()) == holder
    assert Holder.decode("pid=12 host=h since=2026-01-01T00:00:00Z") == Holder(12, "h", "2026-01-01T00:00:00Z")
    assert Holder.decode("") is None and Holder.decode("garbage") is None
