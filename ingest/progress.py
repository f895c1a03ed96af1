"""What a long ``versiq ingest`` is doing, on stderr, while nothing else is printed.

A run logs one line when it enters a phase (``starting Spark``, ``run N over ...``, ``parsed ...``,
``... writing``, ``committing run N``; derived tables and streams likewise). On a loaded machine a
phase can last minutes, and a silent terminal looks like a hang. ``Heartbeat`` repeats the
latest such line every ``interval`` seconds in which nothing else was logged, with how long that
phase has lasted and, once a Spark session runs, the progress of Spark's active stages (its
status tracker: completed, running and total tasks).

When: ``--progress auto`` (the default) beats only when stderr is a terminal, so logs collected
by a service or a test stay one line per phase; ``--progress off`` never; ``--progress 5s`` every
5 seconds whatever stderr is.

Best effort: the heartbeat reads state and never changes it (it never starts a Spark session);
anything it cannot read is left out of its line, and it stops with the command.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from versiq.durations import DurationError, format_duration, parse_duration_ms

#: The loggers whose lines name a phase (every logger of the ingest).
PHASE_LOGGER = "versiq.ingest"
log = logging.getLogger("versiq.ingest.progress")

#: The heartbeat's interval under ``--progress auto`` on a terminal.
DEFAULT_INTERVAL_S = 15.0


def interval_from(option: str, stream: Any = None) -> float | None:
    """The heartbeat interval ``--progress`` asks for (``auto``, ``off`` or a duration), or None
    for no heartbeat; raises ``ValueError`` for anything else."""
    if option == "off":
        return None
    if option == "auto":
        stream = sys.stderr if stream is None else stream
        isatty = getattr(stream, "isatty", None)
        return DEFAULT_INTERVAL_S if isatty is not None and isatty() else None
    try:
        millis = parse_duration_ms(option)
    except DurationError as exc:
        raise ValueError(f"--progress: {exc} (or auto, off)") from None
    if millis <= 0:
        raise ValueError("--progress: the interval must be positive (or auto, off)")
    return millis / 1000.0


class _LastPhase(logging.Handler):
    """Keeps the latest INFO-or-above line of the ingest's loggers and when it was logged."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.line: str | None = None
        self.since = self.last = time.monotonic()

    def emit(self, record: logging.LogRecord) -> None:
        now = time.monotonic()
        self.last = now
        if record.name != log.name:
            try:
                self.line = record.getMessage()
            except Exception:  # noqa: BLE001 - a line that cannot be formatted names no phase
                return
            self.since = now


def spark_progress(spark: Any) -> str:
    """``Spark: stage 3 12/40 tasks (2 running)`` for each active stage of ``spark`` (a running
    session), or an empty text when none is active or the tracker cannot be read."""
    try:
        tracker = spark.sparkContext.statusTracker()
        parts = []
        for stage in sorted(tracker.getActiveStageIds()):
            info = tracker.getStageInfo(stage)
            if info is not None:
                parts.append(f"stage {stage} {info.numCompletedTasks}/{info.numTasks} tasks "
                             f"({info.numActiveTasks} running)")
    except Exception:  # noqa: BLE001 - a session stopping meanwhile: nothing to report
        return ""
    return f"; Spark: {', '.join(parts)}" if parts else ""


class Heartbeat:
    """Within ``with Heartbeat(interval, running_session):``, a line every ``interval`` seconds of
    silence: ``still busy (<how long> since: <the latest phase line>)<Spark's progress>``.
    ``running_session`` returns the Spark session when one runs, else None (never starts one)."""

    def __init__(self, interval: float | None, running_session: Callable[[], Any] = lambda: None) -> None:
        self._interval = interval
        self._running_session = running_session
        self._handler = _LastPhase()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Heartbeat:
        if self._interval is not None:
            logging.getLogger(PHASE_LOGGER).addHandler(self._handler)
            self._thread = threading.Thread(target=self._beat, name="versiq-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            logging.getLogger(PHASE_LOGGER).removeHandler(self._handler)

    def _beat(self) -> None:
        assert self._interval is not None
        while not self._stop.wait(min(self._interval, 1.0)):
            now = time.monotonic()
            if now - self._handler.last < self._interval:
                continue
            phase = self._handler.line or "working"
            session = self._running_session()
            progress = spark_progress(session) if session is not None else ""
            elapsed = round(now - self._handler.since)
            log.info("still busy (%s since: %s)%s", format_duration(max(elapsed, 1) * 1000), phase, progress)
