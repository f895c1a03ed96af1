"""The stores (then the streams, then the derived topologies) of one pipeline run go side by
side, each on a Spark session of its own.

A small run is mostly fixed cost on the driver: planning, Delta's log and commit, scheduling a
few tiny tasks. One store's run leaves both cores half idle, so a pipeline of many stores runs
``VERSIQ_PARALLEL_RUNS`` of them at a time (docs/benchmarks.md has the measurement), and the
derive phase its topologies that share no table (``derived.derive._apart``). Each worker
thread has a session of its own (``WorkerSession``: ``SparkSession.newSession`` with the
caller's SQL settings and versiq's functions) because a run changes its session's settings for
its own work (``spark.plans_for_input``, ``delta.commit_metadata``: the commit's state, no
adaptive execution), and those must not reach a neighbour's commit. Runs of different stores
share nothing else: each holds its own store's writer lock, its own DuckDB connection, its own
Delta table.

A run that plans for much data (not ``RunPlan.small``) waits its ``large_run_turn``: one at a time,
as before. Its stages fill the cores on their own, and its driver-side tables (the parsed run,
its keys' stored versions) are large; small runs go on beside it.

Reports come back in the order of the specs, whatever order the runs end in. The workers are
daemon threads: Ctrl-C ends the process (and with it the JVM) as it did with one run at a time,
each store's commit being atomic. They take the caller's Spark job group and tags, so the
resident driver's cancellation (``cancelAllJobs``) reaches them.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar, cast

from versiq import settings as registry
from versiq.ingest.spark import SparkOnDemand, register_functions, set_active_session
from versiq.logs import counted

log = logging.getLogger("versiq.ingest")

S = TypeVar("S")
R = TypeVar("R")

#: The Spark local properties a worker thread takes from the thread that started it: the job
#: group and tags by which a caller cancels its jobs (not an SQL execution id).
INHERITED_PROPERTIES = ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel",
                        "spark.job.tags")

#: Held by a run that plans for much data, from its plan to its end (``large_run_turn``).
_LARGE_RUNS = threading.Lock()


@contextlib.contextmanager
def large_run_turn(small: bool) -> Iterator[None]:
    """The rest of a run: at once when it plans for little data (``small``: ``RunPlan.small``,
    ``spark.small_run``), else alone among the large runs of this process."""
    if small:
        yield
        return
    with _LARGE_RUNS:
        yield


class WorkerSession(SparkOnDemand):
    """A session of its own for a worker thread, made from ``parent`` (a session or a
    ``SparkOnDemand``) the first time it is used, so a run with nothing new still starts no JVM:
    ``newSession`` (the same SparkContext, separate SQL settings) given the parent's SQL settings
    of that moment and versiq's functions (``spark.register_functions``)."""

    def __init__(self, parent: Any) -> None:
        super().__init__()
        self._parent = parent

    def _start(self) -> Any:
        from pyspark.sql import SparkSession

        parent = self._parent() if isinstance(self._parent, SparkOnDemand) else self._parent
        settings = dict(parent.conf.getAll)
        session = SparkSession(parent.sparkContext, parent._jsparkSession.newSession(), settings)
        register_functions(session)
        set_active_session(session)
        return session

    def master_url(self) -> str:
        """The parent's master (known without starting either session)."""
        if isinstance(self._parent, SparkOnDemand):
            return self._parent.master_url()
        return str(self._parent.sparkContext.master)

    def stop(self) -> None:
        """Nothing: the SparkContext is the parent's, stopped with it."""


def _inherited_properties() -> dict[str, str]:
    from pyspark import SparkContext

    context = SparkContext._active_spark_context
    if context is None:
        return {}
    values = {name: context.getLocalProperty(name) for name in INHERITED_PROPERTIES}
    return {name: value for name, value in values.items() if value is not None}


def _take_properties(properties: dict[str, str]) -> None:
    if not properties:
        return
    from pyspark import SparkContext

    context = SparkContext._active_spark_context
    if context is not None:
        for name, value in properties.items():
            context.setLocalProperty(name, value)


def parallel_runs() -> int:
    """How many runs go at a time (``VERSIQ_PARALLEL_RUNS``, at least 1)."""
    return max(1, registry.PARALLEL_RUNS.value())


def run_side_by_side(spark: Any, specs: Sequence[S], run_one: Callable[[Any, S], R],
                     at_once: int | None = None, what: tuple[str, str] = ("run", "runs")) -> list[R | BaseException]:
    """``run_one(session, spec)`` for every spec, ``at_once`` at a time (default
    ``parallel_runs``); one result per spec, in order: its return value or what it raised. With
    one spec, or one at a time, everything runs on this thread with ``spark`` itself; otherwise
    the run's log says so once (``what``: the specs' noun, singular and plural), before the
    specs' own lines, which then interleave (each names its store or table)."""
    width = min(parallel_runs() if at_once is None else at_once, len(specs))
    results: list[R | BaseException] = []
    if width <= 1:
        for spec in specs:
            try:
                results.append(run_one(spark, spec))
            except Exception as exc:  # noqa: BLE001 - handed back with the others'
                results.append(exc)
        return results
    outcome: list[R | BaseException | None] = [None] * len(specs)
    pending = iter(range(len(specs)))
    taking = threading.Lock()
    properties = _inherited_properties()

    def work() -> None:
        session = WorkerSession(spark)
        _take_properties(properties)
        while True:
            with taking:
                index = next(pending, None)
            if index is None:
                return
            try:
                outcome[index] = run_one(session, specs[index])
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
                outcome[index] = exc

    workers = [threading.Thread(target=work, name=f"versiq-run-{n}", daemon=True) for n in range(width)]
    log.info("%s side by side, %d at a time", counted(len(specs), *what), width)
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return cast("list[R | BaseException]", outcome)
