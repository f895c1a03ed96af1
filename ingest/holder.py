"""The local writer lock's record of its holder, and the end of a dead holder's JVM.

The writer lock of a local store (``store.writer_lock``) is an ``flock`` held by the Python
process of the run, and the OS releases it when that process dies. But the run's commits are
made by its Spark driver JVM, a child process that outlives a killed Python process: PySpark's
gateway exits when its standard input closes, and a commit it is making meanwhile still lands
(``System.exit`` runs the shutdown hooks while the committing thread goes on), seconds later or,
for a JVM that was paused, whenever it resumes. The next writer would take the lock, commit the
same run again, and the old JVM's commit would then add the run a second time.

So the lock file names, besides the holder (``pid=... host=... since=...``), the JVM that
commits for it (``jvm=<pid>/<start>``, written before the holder's first Delta write). A holder
that releases the lock empties the file. A writer that takes the lock and finds a record left
there knows that holder died holding it; if that holder's JVM still runs on this host, the new
writer kills it (SIGKILL, which also ends a paused process) and waits until it is gone before it
reads the store's state. Such a JVM has nobody left to serve: its Python process is dead.

A process is named by its pid *and* its start time (``/proc/<pid>/stat``), so a pid the OS gave
to another process since is never taken for the old JVM.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
from dataclasses import dataclass

from versiq.ingest.errors import LockTimeout

log = logging.getLogger("versiq.ingest")

#: How long a new writer waits for a dead holder's JVM to end after killing it.
JVM_END_TIMEOUT_S = 30.0


def start_time(pid: int) -> str | None:
    """The start time of process ``pid`` (clock ticks since boot, ``/proc/<pid>/stat``), or None
    when there is no such process, it is a zombie (it can do nothing more), or no ``/proc``."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # after the command's ")": state is field 3 of the stat line, starttime field 22
    return None if fields[0] in ("Z", "X") else fields[19]


@dataclass(frozen=True)
class Holder:
    """What the lock file says of the writer that holds (or held) the lock."""

    pid: int
    host: str
    since: str
    start: str | None = None
    jvm: int | None = None
    jvm_start: str | None = None

    @classmethod
    def me(cls) -> Holder:
        pid = os.getpid()
        return cls(pid=pid, host=socket.gethostname(), since=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                   start=start_time(pid))

    def with_jvm(self, jvm: int) -> Holder:
        return Holder(self.pid, self.host, self.since, self.start, jvm, start_time(jvm))

    def encode(self) -> str:
        """``pid=1 host=h since=2026-...Z`` (the lock timeout's message shows it), then the
        process start and the JVM when known."""
        text = f"pid={self.pid} host={self.host} since={self.since}"
        if self.start is not None:
            text += f" start={self.start}"
        if self.jvm is not None:
            text += f" jvm={self.jvm}/{self.jvm_start or '?'}"
        return text

    @classmethod
    def decode(cls, text: str) -> Holder | None:
        """The holder a lock file names, or None for an empty (released) or unreadable one."""
        fields = dict(part.split("=", 1) for part in text.split() if "=" in part)
        try:
            jvm, _, jvm_start = fields["jvm"].partition("/") if "jvm" in fields else ("", "", "")
            return cls(pid=int(fields["pid"]), host=fields.get("host", ""), since=fields.get("since", ""),
                       start=fields.get("start"), jvm=int(jvm) if jvm else None,
                       jvm_start=jvm_start if jvm_start not in ("", "?") else None)
        except (KeyError, ValueError):
            return None

    def alive(self) -> bool:
        """Whether the holder's own process still runs (judged on this host only)."""
        return self.start is not None and start_time(self.pid) == self.start

    def orphan_jvm(self) -> int | None:
        """The pid of this holder's JVM when it still runs on this host while the holder does
        not: a JVM that may still commit for a run whose process died."""
        if self.jvm is None or self.jvm_start is None or self.host != socket.gethostname():
            return None
        if self.pid == os.getpid() or self.alive():
            return None
        return self.jvm if start_time(self.jvm) == self.jvm_start else None


def end_orphan_jvm(previous: Holder | None, store: str) -> None:
    """Kill the JVM of a holder that died holding the lock of ``store`` (``Holder.orphan_jvm``)
    and wait until it is gone, so that nothing of the dead run commits after this writer has
    read the store's state. Called with the lock held."""
    jvm = previous.orphan_jvm() if previous is not None else None
    if jvm is None or previous is None:
        return
    log.warning("store %s: the previous writer (pid %d) died holding the lock; its Spark JVM (pid %d) still "
                "runs and could commit that writer's run late: killing it", store, previous.pid, jvm)
    try:
        os.kill(jvm, signal.SIGKILL)
    except ProcessLookupError:
        return
    except PermissionError:
        raise LockTimeout(f"store {store!r}: the Spark JVM (pid {jvm}) of a writer that died holding its lock "
                          "still runs and belongs to another user; end it before writing") from None
    deadline = time.monotonic() + JVM_END_TIMEOUT_S
    while start_time(jvm) == previous.jvm_start:
        if time.monotonic() >= deadline:
            raise LockTimeout(f"store {store!r}: the Spark JVM (pid {jvm}) of a writer that died holding its lock "
                              f"did not end within {JVM_END_TIMEOUT_S:g}s of SIGKILL")
        time.sleep(0.02)
