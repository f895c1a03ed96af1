"""The ``max_future`` guard of a run: how far past the run's wall clock a record's timestamp may be.

One rule for stores and streams: a record later than the bound is refused with reason
``future`` (kept in the table's ``_rejected``), so a broken clock or a poison record can never
move a store's stream time (or, through a stream, a derived table's) into the future.
"""

from __future__ import annotations

import time

from versiq.durations import parse_duration_ms

#: Default ``max_future``: a record more than 1 hour after the wall clock of its run is refused.
DEFAULT_MAX_FUTURE_MS = 3_600_000


def parse_max_future(text: str) -> int | None:
    """``max_future`` as given on the command line or in a pipeline file: a duration, or
    ``none`` for no limit. Raises DurationError."""
    return None if text.strip().lower() == "none" else parse_duration_ms(text)


def future_bound(max_future_ms: int | None, now_ms: int | None = None) -> int | None:
    """The latest timestamp a run accepts: its wall clock (taken once, on the driver, when the
    run starts) plus ``max_future_ms``; None when there is no limit.

    Why per run and not a store setting: like a Kafka broker's
    ``log.message.timestamp.after.max.ms`` (KIP-937) it guards the input against broken clocks
    and poison records; it is not part of the store's semantics. A record refused today can be
    ingested once its time has come (from a new file; a file is never read twice)."""
    if max_future_ms is None:
        return None
    now = int(time.time() * 1000) if now_ms is None else now_ms
    return min(now + max_future_ms, 2**63 - 1)
