"""What the differential tests against Kafka Streams (tests/conformance) share: the seed their
scenarios come from, their time limit and their report of differences. No tests here.

Seed. ``VERSIQ_CONFORMANCE_SEED`` when set, else ``FIXED_SEED``: ``make test`` compares the same
scenarios on every run (a failure there is reproducible as is), while ``make conformance``
draws a fresh seed per run, prints it first and passes it in, so each long run explores
scenarios no earlier run compared. The scenarios are generated from ``random.Random(seed)``
directly: one seed, one list of scenarios, on any machine.

Time limit. A run's limit grows with its scenario count and with the machine's load (load
average per core, at least 1), so a busy machine makes a run slower, not a failure; or
``VERSIQ_CONFORMANCE_TIMEOUT`` seconds. It is checked between batches (a Spark job is never
interrupted midway, which would leave the session unusable), and a run over it stops with one
line saying so. pytest-timeout's limit for the test (``backstop_s``: twice that plus ``BASE_S``,
so a short limit still leaves Spark time to start) is a backstop for a batch that hangs, not
the measure.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import pytest

SEED_VARIABLE = "VERSIQ_CONFORMANCE_SEED"
TIMEOUT_VARIABLE = "VERSIQ_CONFORMANCE_TIMEOUT"
#: The seed of ``make test`` and of a run without VERSIQ_CONFORMANCE_SEED.
FIXED_SEED = 0
#: Time a run may take regardless of its size (Spark and JVM starts, the first jobs), in seconds.
BASE_S = 600.0
#: Time per scenario compared, in seconds (2 cores, unloaded: well under a tenth of this).
PER_SCENARIO_S = 0.2


def conformance_seed(environ: Mapping[str, str] = os.environ) -> int:
    """The seed of this run's scenarios: VERSIQ_CONFORMANCE_SEED, else ``FIXED_SEED``."""
    text = environ.get(SEED_VARIABLE, "").strip()
    return int(text) if text else FIXED_SEED


def repeat_hint(seed: int) -> str:
    """How to run the same scenarios again."""
    return f"repeat them with {SEED_VARIABLE}={seed} make conformance"


def machine_factor() -> float:
    """How much slower than an idle machine this one is likely to run: the 1-minute load average
    per core, at least 1."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # not available on this platform
        return 1.0
    return max(1.0, load / (os.cpu_count() or 1))


def time_limit_s(scenarios: int, environ: Mapping[str, str] = os.environ, factor: float | None = None) -> float:
    """The time a run of ``scenarios`` scenarios may take: VERSIQ_CONFORMANCE_TIMEOUT seconds when
    set, else ``(BASE_S + PER_SCENARIO_S * scenarios)`` times the machine's load factor."""
    text = environ.get(TIMEOUT_VARIABLE, "").strip()
    if text:
        return float(text)
    return (BASE_S + PER_SCENARIO_S * scenarios) * (machine_factor() if factor is None else factor)


def backstop_s(limit_s: float) -> float:
    """pytest-timeout's limit for a test whose own limit is ``limit_s``: room for the batch under
    way when the limit passes and for starting Spark (pytest-timeout counts fixture setup too)."""
    return 2 * limit_s + BASE_S


@dataclass
class TimeLimit:
    """A run's time limit, checked between its batches (``check``)."""

    limit_s: float
    what: str
    clock: Callable[[], float] = time.monotonic
    started: float = field(init=False)

    def __post_init__(self) -> None:
        self.started = self.clock()

    def over(self) -> bool:
        return self.clock() - self.started > self.limit_s

    def message(self, done: int, total: int, differences: int, seed: int) -> str:
        """One line: the limit, how far the run got, what it found."""
        elapsed = self.clock() - self.started
        return (f"{self.what}: over its time limit of {self.limit_s:.0f} s ({elapsed:.0f} s, {TIMEOUT_VARIABLE} "
                f"sets it) after {done} of {total} batches, {differences} difference(s) so far; seed {seed}")

    def check(self, done: int, total: int, differences: int, seed: int) -> None:
        """Fail the test in one line when the run is over its limit with batches left."""
        if done < total and self.over():
            pytest.fail(self.message(done, total, differences, seed), pytrace=False)


def append_report(path: str, heading: str, differences: list[str]) -> list[str]:
    """Append to the report file at ``path`` each of ``differences`` under ``heading`` (one entry
    per difference: ``heading: difference``, its further lines indented), unless the file already
    lists it: a rerun of the same seed and batch finds the same differences. Returns those written.
    Written as found, so a later failure of the run cannot lose them."""
    entries = [f"{heading}: {d}" for d in differences]
    known = set(_entries(path))
    new = [e for e in dict.fromkeys(entries) if e not in known]
    if new:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write("".join(e + "\n" for e in new))
    return new


def _entries(path: str) -> list[str]:
    """The entries of a report file: a line that does not start with a space begins one."""
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except FileNotFoundError:
        return []
    entries: list[str] = []
    for line in lines:
        if line[:1].isspace() and entries:
            entries[-1] += "\n" + line
        elif line:
            entries.append(line)
    return entries
