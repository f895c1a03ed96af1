"""The stores, streams and independent derived passes of a pipeline run side by side
(``versiq.ingest.side_by_side``): each commit carries its own table's state, results come back
in order, large runs go one at a time, derived topologies that share a table one after the other."""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import time
from typing import Any

import pytest

from tests.support.derived import RealPipeline
from tests.support.derived_reference import InputDef, Rec
from versiq import storage
from versiq.ingest.derived.derive import Topology, _apart
from versiq.ingest.derived.spec import parse_tables
from versiq.ingest.side_by_side import large_run_turn, run_side_by_side
from versiq.layout import read_state

STORES = 3


def _runs(seed: int) -> list[dict[str, list[Rec]]]:
    rng = random.Random(seed)

    def records(count: int) -> list[Rec]:
        return [Rec(f"k{rng.randint(1, 6)}", json.dumps({"n": rng.randint(0, 9)}), rng.randint(0, 60))
                for _ in range(count)]

    return [{"A": records(rng.randint(5, 30)), "S": records(rng.randint(0, 10))} for _ in range(2)]


def test_each_commit_of_a_pipeline_run_side_by_side_carries_its_own_tables_state(
        spark: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Three stores, three streams and nine derived tables (of each store two filters, one pass
    of two topologies, and a stream-table join), two runs, three at a time: the runs did go on
    several threads, and every commit of every table carries that table's state, never a
    neighbour's (each worker's session has its own commit metadata: ``delta.commit_metadata``).
    Their results against the reference model, side by side as well:
    tests/ingest/derived/test_derived_property.py and the operators' differential test."""
    monkeypatch.setenv("VERSIQ_PARALLEL_RUNS", "3")
    real = RealPipeline(spark, str(tmp_path))
    for i in range(STORES):
        real.add(f"p{i}_", [InputDef("A", "versioned", 30), InputDef("S", "stream")],
                 [{"name": "big", "from": "A", "filter": "value.n > 3", "history_retention_ms": 30},
                  {"name": "small", "from": "A", "filter": "value.n <= 3", "history_retention_ms": 30},
                  {"name": "joined", "stream_join": {"stream": "S", "table": "A", "type": "left"}}],
                 _runs(i))
    with caplog.at_level(logging.INFO, logger="versiq.ingest"):
        real.run_all()
    threads = {r.threadName for r in caplog.records if r.getMessage().startswith(("store p", "derived pass over"))}
    assert len({t for t in threads if t.startswith("versiq-run-")}) >= 2, threads
    for i in range(STORES):
        prefix = f"p{i}_"
        for table in ("A", "S", "big", "small", "joined"):
            path = os.path.join(real.warehouse, prefix + table)
            newest = storage.delta_table(path).version()
            states = [read_state(path, version) for version in range(newest + 1)]
            assert states[-1].run == 2, (table, states[-1])
            if table in ("A", "S"):  # its own source's files, no other store's
                files = sorted(os.listdir(os.path.join(real.root, "sources", prefix + table)))
                assert files and states[-1].done_files == files, (table, files, states[-1])
                assert all(set(state.done_files) <= set(files) for state in states), (table, states)
            else:  # the runs of its own sources
                own = {f"{prefix}A"} | ({f"{prefix}S"} if table == "joined" else set())
                assert all(set(state.sources) == own for state in states), (table, states)
                assert all(source["run"] == 2 for source in states[-1].sources.values()), states[-1]


def test_results_come_back_in_order_and_failures_are_handed_back() -> None:
    """Each spec's result or exception, in the specs' order, whichever ends first; a failure
    does not stop the others."""
    def run(session: Any, n: int) -> int:
        time.sleep(0.01 * (5 - n))
        if n == 2:
            raise ValueError("two")
        return n * 10

    results = run_side_by_side(None, list(range(5)), run, at_once=3)
    assert results[:2] == [0, 10] and results[3:] == [30, 40]
    assert isinstance(results[2], ValueError) and str(results[2]) == "two"
    assert run_side_by_side(None, [1], run, at_once=3) == [10]  # one spec: on this thread


def test_large_runs_take_turns_and_small_runs_do_not() -> None:
    """Never two large runs at once; small runs beside them and each other."""
    inside = {"large": 0, "small": 0}
    most = {"large": 0, "small": 0}
    lock = threading.Lock()

    def run(_session: Any, kind: str) -> None:
        with large_run_turn(kind == "small"):
            with lock:
                inside[kind] += 1
                most[kind] = max(most[kind], inside[kind])
            time.sleep(0.05)
            with lock:
                inside[kind] -= 1

    outcomes = run_side_by_side(None, ["large", "small", "large", "small", "large", "small"], run, at_once=6)
    assert outcomes == [None] * 6
    assert most == {"large": 1, "small": 3}


def test_topologies_that_share_a_table_are_one_group_in_order() -> None:
    """Topologies run side by side only when they share no derived table (a pass's never do;
    a topology of another pass may read a table one writes); a group keeps their order."""
    specs = {t.name: t for t in parse_tables([{"name": "a", "from": "s", "filter": "value.n > 1"},
                                              {"name": "b", "from": "a", "filter": "value.n > 2"},
                                              {"name": "c", "from": "s", "filter": "value.n > 3"},
                                              {"name": "d", "from": "s", "filter": "value.n > 4"},
                                              {"name": "e", "from": "d", "filter": "value.n > 5"}],
                                             {"s": "versioned"})}
    tables = [["a"], ["c"], ["a", "b"], ["d", "e"], ["d"]]
    topologies = [Topology([specs[name] for name in names], names, ["s"], {"s": n}) for n, names in enumerate(tables)]
    groups = _apart(topologies)
    assert sorted([t.start["s"] for t in group] for group in groups) == [[0, 2], [1], [3, 4]]
