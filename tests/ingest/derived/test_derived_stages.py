"""How a derived pass is cut at its repartitions (``tasks.repartitionable``, ``tasks.stages``;
docs/semantics.md, rule 23, "Partitions"): which topologies run in their stores' partitions,
and what each stage computes, reads and writes. No Spark: the plans only."""

from __future__ import annotations

from typing import Any

import pytest

from versiq.ingest.derived.spec import parse_tables
from versiq.ingest.derived.tasks import PassWork, TableRead, repartitionable, stages

KINDS = {"orders": "versioned", "customers": "versioned", "clicks": "stream"}
COUNT = {"aggregate": {"count": True}}


def _tables(entries: list[dict[str, Any]]) -> list[Any]:
    return parse_tables(entries, KINDS)


def _work(entries: list[dict[str, Any]], writers: list[str], partitions: int = 3) -> PassWork:
    tables = _tables(entries)
    reads = tuple(TableRead(name, f"/w/{name}", None, "versioned", 0, 4)
                  for name in ["orders", "customers", *(t.name for t in tables if not t.is_stream)])
    return PassWork(tables=tuple(tables), writers=tuple(writers), reads=reads,
                    inputs=(("orders", False), ("customers", False)),
                    runs=tuple((w, 1) for w in writers), partitions=partitions)


@pytest.mark.rule(23)
@pytest.mark.parametrize(("entries", "expected"), [
    ([{"name": "f", "from": "orders", "filter": "value.n > 1"}], True),
    ([{"name": "g", "from": "orders", "group_by": "value.c", **COUNT},
      {"name": "busy", "from": "g", "filter": "value.count > 2"}], True),
    ([{"name": "f", "from": "orders", "filter": "value.n > 1"},
      {"name": "g", "from": "f", "group_by": "value.c", **COUNT},
      {"name": "h", "from": "orders", "group_by": "value.d", "reduce": {"add": "agg + value.n",
                                                                          "subtract": "agg - value.n"}}], True),
    # a foreign-key join: its subscriptions and responses are not built as repartitions
    ([{"name": "j", "fk_join": {"left": "orders", "right": "customers", "foreign_key": "value.c"}}], False),
    # a table that reads an aggregate and another input
    ([{"name": "g", "from": "orders", "group_by": "value.c", **COUNT},
      {"name": "j", "join": {"left": "g", "right": "customers"}}], False),
    # a group-by after a group-by
    ([{"name": "g", "from": "orders", "group_by": "value.c", **COUNT},
      {"name": "gg", "from": "g", "group_by": "value.count", **COUNT}], False),
])
def test_which_topologies_cross_a_repartition(entries: list[dict[str, Any]], expected: bool) -> None:
    assert repartitionable(_tables(entries)) is expected


@pytest.mark.rule(23)
def test_a_pass_is_cut_into_a_first_stage_and_one_stage_per_aggregate() -> None:
    entries = [
        {"name": "f", "from": "orders", "filter": "value.n > 1"},
        {"name": "g", "from": "f", "group_by": "value.c", **COUNT},
        {"name": "busy", "from": "g", "filter": "value.count > 2"},
        {"name": "h", "from": "orders", "group_by": "value.d", **COUNT},
    ]
    work = _work(entries, ["f", "g", "busy", "h"])
    first, *later = stages(work)
    # the first stage runs everything up to the aggregates, which only route their updates
    assert [t.name for t in first.tables] == ["f", "g", "h"]
    assert first.repartitioned == ("g", "h") and first.regrouped == ""
    assert first.writers == ("f",) and [r.name for r in first.reads] == ["orders", "customers", "f"]
    assert first.inputs == work.inputs and dict(first.runs) == {"f": 1}
    # each aggregate's stage: the aggregate first, then the tables that read it; no source input
    assert [(s.regrouped, [t.name for t in s.tables], s.writers, [r.name for r in s.reads], s.inputs)
            for s in later] == [("g", ["g", "busy"], ("g", "busy"), ["g", "busy"], ()),
                                ("h", ["h"], ("h",), ["h"], ())]
    assert all(s.partitions == 3 and s.repartitioned == () for s in later)


@pytest.mark.rule(23)
def test_an_up_to_date_aggregate_is_recomputed_for_its_readers_but_not_written() -> None:
    entries = [{"name": "g", "from": "orders", "group_by": "value.c", **COUNT},
               {"name": "busy", "from": "g", "filter": "value.count > 2"}]
    first, later = stages(_work(entries, ["busy"]))
    assert first.writers == () and later.writers == ("busy",)
    assert [r.name for r in later.reads] == ["g", "busy"]


def test_one_partition_is_one_stage() -> None:
    work = _work([{"name": "g", "from": "orders", "group_by": "value.c", **COUNT}], ["g"], partitions=1)
    assert stages(work) == [work]
