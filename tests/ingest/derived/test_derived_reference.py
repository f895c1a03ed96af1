"""The derived-table reference model (tests/support/derived_reference.py) against the KIP examples and
a few hand-computed cases per operator (docs/derived-tables.md; docs/semantics.md, rules 13-18 and
23-30). Pure Python, fast.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.derived_reference import Emission, InputDef, Rec, TableResult, run_pipeline
from tests.support.kip_examples import EXAMPLES, KipExample, j, s


def triples(result: TableResult) -> list[tuple[str, str | None, int]]:
    return [(e.key, e.value, e.timestamp) for e in result.emissions]


# ------------------------------------------------------------------------------------ KIP examples
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda ex: ex.name)
def test_kip_example(example: KipExample) -> None:
    results = run_pipeline(example.inputs, example.tables, example.runs)
    for table, expected in example.emissions.items():
        assert triples(results[table]) == expected, table
        if not results[table].versions:  # a stream output: its records are its emissions
            assert results[table].records == expected, table
    for table, versions in example.versions.items():
        assert results[table].versions == versions, table


def test_kip_examples_cover_every_normative_example() -> None:
    names = {ex.name for ex in EXAMPLES if ex.normative}
    assert {
        "kip914_proposal_a0_a5_b2_b3_b4_a1", "kip914_proposal_a0_b2_a5_a1",
        "kip914_filter_versioned_keeps_duplicate_tombstones", "kip914_aggregate_versioned_ignores_out_of_order",
        "kip914_stream_table_join_as_of", "kip904_count_no_transient_state", "kip213_lhs_event_table",
    } <= names


@pytest.mark.rule(24)
def test_emission_run_sequence_and_cause() -> None:
    ex = next(e for e in EXAMPLES if e.name == "kip213_lhs_event_table")
    left = run_pipeline(ex.inputs, ex.tables, ex.runs)["left"]
    assert [(e.run, e.sequence, e.cause) for e in left.emissions] == [
        (2, 1, "L"), (2, 2, "L"), (2, 3, "L"),
        (3, 1, "R"),
        (4, 1, "L"), (4, 2, "L"), (4, 3, "L"),
        (5, 1, "R"),
    ]
    assert left.counts == {"emitted": 8, "accepted_latest": 8, "accepted_out_of_order": 0, "tombstones": 1,
                           "late": 0}


def test_cause_is_the_direct_input_and_changes_flow_depth_first() -> None:
    inputs = [InputDef("T", "versioned")]
    tables: list[dict[str, Any]] = [
        {"name": "big", "from": "T", "filter": "value > 10"},
        {"name": "copy", "from": "big"},
        {"name": "counts", "from": "T", "group_by": "'all'", "aggregate": {"count": True}},
    ]
    results = run_pipeline(inputs, tables, [{"T": [Rec("a", "20", 1), Rec("b", "5", 2)]}])
    assert results["copy"].emissions == [
        Emission(1, 1, "a", "20", 1, "big"), Emission(1, 2, "b", None, 2, "big"),
    ]
    assert [e.cause for e in results["counts"].emissions] == ["T", "T"]


# ------------------------------------------------------------------------------------ merge order
@pytest.mark.rule(23)
def test_merge_by_head_timestamp_ties_to_first_declared() -> None:
    inputs = [InputDef("A", "versioned"), InputDef("B", "versioned")]
    tables: list[dict[str, Any]] = [{"name": "ab", "join": {"left": "A", "right": "B", "type": "outer"}}]
    # heads: A@5 vs B@3 -> B; A@5 vs B@5 -> A (declared first); A@1 vs B@5 -> A (a1 is out-of-order on
    # versioned A: nothing); then B@5. Each input keeps its own order: a5 before a1.
    run = {"A": [Rec("k", s("a5"), 5), Rec("k", s("a1"), 1)], "B": [Rec("k", s("b3"), 3), Rec("k", s("b5"), 5)]}
    result = run_pipeline(inputs, tables, [run])["ab"]
    assert triples(result) == [
        ("k", j(None, s("b3")), 3),
        ("k", j(s("a5"), s("b3")), 5),
        ("k", j(s("a5"), s("b5")), 5),
    ]


# ---------------------------------------------------------------------------------- join operators
@pytest.mark.rule(26)
def test_join_result_timestamp_floor() -> None:
    """Outer join: after a@10 and its delete @11, b@5 (other side empty) is stamped 11, not 5."""
    inputs = [InputDef("A", "versioned"), InputDef("B", "versioned")]
    tables: list[dict[str, Any]] = [{"name": "ab", "join": {"left": "A", "right": "B", "type": "outer"}}]
    runs = [{"A": [Rec("k", s("a"), 10), Rec("k", None, 11)]}, {"B": [Rec("k", s("b"), 5)]}]
    result = run_pipeline(inputs, tables, runs)["ab"]
    assert triples(result) == [("k", j(s("a"), None), 10), ("k", None, 11), ("k", j(None, s("b")), 11)]
    assert result.versions == {"k": [(10, 11, j(s("a"), None)), (11, None, j(None, s("b")))]}
    assert result.counts["accepted_out_of_order"] == 0


@pytest.mark.rule(15)
def test_join_unversioned_side_out_of_order_still_emits() -> None:
    inputs = [InputDef("A", "timestamped"), InputDef("B", "versioned")]
    tables: list[dict[str, Any]] = [{"name": "ab", "join": {"left": "A", "right": "B", "type": "inner"}}]
    runs = [{"B": [Rec("k", s("b"), 1)]}, {"A": [Rec("k", s("a5"), 5), Rec("k", s("a2"), 2)]}]
    assert triples(run_pipeline(inputs, tables, runs)["ab"]) == [
        ("k", j(s("a5"), s("b")), 5), ("k", j(s("a2"), s("b")), 5),
    ]


def test_join_left_and_select() -> None:
    inputs = [InputDef("A", "versioned"), InputDef("B", "versioned")]
    tables: list[dict[str, Any]] = [{
        "name": "v", "join": {"left": "A", "right": "B", "type": "left"},
        "select": {"total": "value.left.n + coalesce(value.right.n, 0)", "k": "key"},
    }]
    runs = [{"A": [Rec("k", '{"n":1.50}', 1)]}, {"B": [Rec("k", '{"n":2.25}', 2), Rec("x", '{"n":1}', 3)]}]
    assert triples(run_pipeline(inputs, tables, runs)["v"]) == [
        ("k", '{"total":1.5,"k":"k"}', 1), ("k", '{"total":3.75,"k":"k"}', 2),
    ]  # B's x has no A value: a left join emits nothing for it


@pytest.mark.rule(16)
def test_fk_join_change_retracts_old_result() -> None:
    inputs = [InputDef("L", "versioned"), InputDef("R", "versioned")]
    tables: list[dict[str, Any]] = [
        {"name": "inner", "fk_join": {"left": "L", "right": "R", "foreign_key": "value.fk", "type": "inner"}},
        {"name": "left", "fk_join": {"left": "L", "right": "R", "foreign_key": "value.fk", "type": "left"}},
    ]
    a1, a2, a3 = '{"fk":"r1"}', '{"fk":"r2"}', '{"fk":"r3"}'
    runs = [
        {"R": [Rec("r1", s("one"), 1), Rec("r3", s("three"), 2)]},
        {"L": [Rec("k", a1, 3), Rec("k", a2, 4), Rec("k", a3, 5)]},
        {"R": [Rec("r1", s("uno"), 6)]},  # k no longer points at r1: no result
    ]
    results = run_pipeline(inputs, tables, runs)
    assert triples(results["inner"]) == [("k", j(a1, s("one")), 3), ("k", None, 4), ("k", j(a3, s("three")), 5)]
    assert triples(results["left"]) == [
        ("k", j(a1, s("one")), 3), ("k", j(a2, None), 4), ("k", j(a3, s("three")), 5),
    ]


@pytest.mark.rule(28)
def test_fk_join_null_foreign_key() -> None:
    inputs = [InputDef("L", "versioned"), InputDef("R", "versioned")]
    tables: list[dict[str, Any]] = [
        {"name": "inner", "fk_join": {"left": "L", "right": "R", "foreign_key": "value.fk", "type": "inner"}},
        {"name": "left", "fk_join": {"left": "L", "right": "R", "foreign_key": "value.fk", "type": "left"}},
    ]
    with_fk, no_fk = '{"fk":"r"}', '{"fk":null}'
    runs = [
        {"R": [Rec("r", s("x"), 1)]},
        {"L": [Rec("k", with_fk, 2), Rec("k", no_fk, 3), Rec("n", no_fk, 4)]},
        {"R": [Rec("r", s("y"), 5)]},  # nobody points at r any more
    ]
    results = run_pipeline(inputs, tables, runs)
    # inner: the null FK retracts k's result; a new key with a null FK has nothing to retract
    assert triples(results["inner"]) == [("k", j(with_fk, s("x")), 2), ("k", None, 3)]
    assert triples(results["left"]) == [
        ("k", j(with_fk, s("x")), 2), ("k", j(no_fk, None), 3), ("n", j(no_fk, None), 4),
    ]


def test_fk_join_right_update_fans_out_in_key_order() -> None:
    inputs = [InputDef("L", "versioned"), InputDef("R", "timestamped")]
    tables: list[dict[str, Any]] = [
        {"name": "inner", "fk_join": {"left": "L", "right": "R", "foreign_key": "value", "type": "inner"}},
    ]
    runs = [
        {"L": [Rec("b", s("f"), 30), Rec("c", s("f"), 10), Rec("a", s("f"), 20), Rec("d", s("g"), 1)]},
        {"R": [Rec("f", s("v1"), 5)]},
        {"R": [Rec("f", None, 6)]},
    ]
    result = run_pipeline(inputs, tables, runs)["inner"]
    assert triples(result) == [
        ("a", j(s("f"), s("v1")), 5), ("b", j(s("f"), s("v1")), 5), ("c", j(s("f"), s("v1")), 5),
        ("a", None, 6), ("b", None, 6), ("c", None, 6),
    ]  # each stamped with the right change's timestamp, as Kafka does (floored by the previous result)
    assert [e.run for e in result.emissions] == [2, 2, 2, 3, 3, 3]
    assert result.counts["tombstones"] == 3


def test_fk_join_versioned_out_of_order_emits_nothing() -> None:
    inputs = [InputDef("L", "versioned"), InputDef("R", "versioned")]
    tables: list[dict[str, Any]] = [
        {"name": "left", "fk_join": {"left": "L", "right": "R", "foreign_key": "value", "type": "left"}},
    ]
    runs = [
        {"R": [Rec("f", s("new"), 10)]},
        {"L": [Rec("k", s("f"), 10), Rec("k", s("g"), 5)]},  # k@5 is out-of-order on L
        {"R": [Rec("f", s("old"), 3)]},  # out-of-order on R
    ]
    assert triples(run_pipeline(inputs, tables, runs)["left"]) == [("k", j(s("f"), s("new")), 10)]


# ------------------------------------------------------------------------------- stream operators
def test_stream_to_table_and_stream_output_to_table() -> None:
    inputs = [InputDef("T", "versioned"), InputDef("S", "stream")]
    tables: list[dict[str, Any]] = [
        {"name": "priced", "stream_join": {"stream": "S", "table": "T", "type": "left"}},
        {"name": "last", "from": "priced"},
        {"name": "big", "from": "S", "filter": "value > 5"},
    ]
    runs = [{"T": [Rec("p", "2", 0)]}, {"S": [Rec("p", "7", 1), Rec("p", "3", 2), Rec("q", None, 3)]}]
    results = run_pipeline(inputs, tables, runs)
    assert results["priced"].records == [("p", j("7", "2"), 1), ("p", j("3", "2"), 2)]
    assert results["priced"].versions == {}
    assert results["last"].versions == {"p": [(1, 2, j("7", "2")), (2, None, j("3", "2"))]}
    assert [e.cause for e in results["last"].emissions] == ["priced", "priced"]
    assert results["big"].versions == {"p": [(1, None, "7")]}  # the stream filter drops, never deletes


@pytest.mark.rule(14, 25)
def test_stream_join_timestamped_table_uses_current_value() -> None:
    inputs = [InputDef("T", "timestamped"), InputDef("S", "stream")]
    tables: list[dict[str, Any]] = [{"name": "o", "stream_join": {"stream": "S", "table": "T", "type": "inner"}}]
    runs = [{"T": [Rec("k", s("t9"), 9)]}, {"S": [Rec("k", s("s1"), 1)]}]
    assert run_pipeline(inputs, tables, runs)["o"].records == [("k", j(s("s1"), s("t9")), 1)]


# ------------------------------------------------------------------------------- group/aggregate
_AGG: list[dict[str, Any]] = [
    {"name": "agg", "from": "T", "group_by": "value.g", "aggregate": {"count": True, "sum": "value.n"}},
]


def test_group_change_subtracts_then_adds() -> None:
    runs = [{"T": [Rec("k", '{"g":"x","n":5}', 1), Rec("j", '{"g":"x","n":2.5}', 2), Rec("k", '{"g":"y","n":7}', 3)]}]
    result = run_pipeline([InputDef("T", "versioned")], _AGG, runs)["agg"]
    assert triples(result) == [
        ("x", '{"count":1,"sum":5}', 1),
        ("x", '{"count":2,"sum":7.5}', 2),
        ("x", '{"count":1,"sum":2.5}', 3),  # subtract k from its old group first ...
        ("y", '{"count":1,"sum":7}', 3),  # ... then add it to its new group
    ]


@pytest.mark.rule(30)
def test_empty_group_keeps_zero_aggregate_and_group_timestamp_is_monotone() -> None:
    runs = [{"T": [Rec("k", '{"g":"x","n":5}', 10), Rec("j", '{"g":"x","n":"bad"}', 4), Rec("k", None, 12),
                   Rec("j", '{"n":1}', 13)]}]
    result = run_pipeline([InputDef("T", "versioned")], _AGG, runs)["agg"]
    assert triples(result) == [
        ("x", '{"count":1,"sum":5}', 10),
        ("x", '{"count":2,"sum":5}', 10),  # a non-numeric sum input is ignored; stamped max(4, 10)
        ("x", '{"count":1,"sum":0}', 12),
        ("x", '{"count":0,"sum":0}', 13),  # j's new group is null: only the subtraction
    ]
    assert result.versions == {"x": [(10, 12, '{"count":2,"sum":5}'), (12, 13, '{"count":1,"sum":0}'),
                                     (13, None, '{"count":0,"sum":0}')]}
    assert result.counts["tombstones"] == 0


@pytest.mark.rule(17)
def test_aggregate_same_group_is_one_atomic_update() -> None:
    runs = [{"T": [Rec("k", '{"g":"x","n":1}', 1), Rec("k", '{"g":"x","n":4}', 2)]}]
    result = run_pipeline([InputDef("T", "timestamped")], _AGG, runs)["agg"]
    assert triples(result) == [("x", '{"count":1,"sum":1}', 1), ("x", '{"count":1,"sum":4}', 2)]


# ---------------------------------------------------------------------------------------- filter
@pytest.mark.rule(13)
def test_filter_timestamped_input_drops_duplicate_tombstone() -> None:
    tables: list[dict[str, Any]] = [{"name": "f", "from": "T", "filter": "value.ok"}]
    recs = [Rec("k", '{"ok":false}', 1), Rec("k", None, 2), Rec("k", '{"ok":true}', 3), Rec("k", None, 4),
            Rec("k", None, 5)]
    timestamped = run_pipeline([InputDef("T", "timestamped")], tables, [{"T": recs}])["f"]
    assert triples(timestamped) == [("k", '{"ok":true}', 3), ("k", None, 4)]
    versioned = run_pipeline([InputDef("T", "versioned")], tables, [{"T": recs}])["f"]
    assert triples(versioned) == [("k", None, 1), ("k", None, 2), ("k", '{"ok":true}', 3), ("k", None, 4),
                                  ("k", None, 5)]


# --------------------------------------------------------------------------- derived store grace
@pytest.mark.rule(29)
def test_late_result_goes_to_derived_rejected() -> None:
    inputs = [InputDef("T", "versioned")]
    tables: list[dict[str, Any]] = [
        {"name": "copy", "from": "T", "history_retention_ms": 10},
        {"name": "copy2", "from": "copy"},
    ]
    runs = [{"T": [Rec("a", s("a"), 100), Rec("b", s("b"), 50), Rec("c", s("c"), 90), Rec("a", s("a2"), 95)]}]
    results = run_pipeline(inputs, tables, runs)
    copy = results["copy"]
    assert [e.key for e in copy.emissions] == ["a", "b", "c", "a"]  # emissions are before the grace
    assert copy.counts == {"emitted": 4, "accepted_latest": 2, "accepted_out_of_order": 1, "tombstones": 0,
                           "late": 1}
    assert copy.versions == {"a": [(95, 100, s("a2")), (100, None, s("a"))], "c": [(90, None, s("c"))]}
    assert [e.key for e in results["copy2"].emissions] == ["a", "c", "a"]  # a late result yields no change


def test_source_grace_is_per_partition() -> None:
    inputs = [InputDef("T", "versioned", history_retention_ms=10, partitions=2)]
    tables: list[dict[str, Any]] = [{"name": "copy", "from": "T"}]
    runs = [{"T": [Rec("a", s("a"), 100, partition=0), Rec("b", s("b"), 5, partition=1),
                   Rec("c", s("c"), 50, partition=0)]}]
    assert [e.key for e in run_pipeline(inputs, tables, runs)["copy"].emissions] == ["a", "b"]  # c is late in p0


def test_timestamped_derived_table() -> None:
    tables: list[dict[str, Any]] = [{"name": "copy", "from": "T", "kind": "timestamped"}]
    runs = [{"T": [Rec("a", s("a5"), 5), Rec("a", s("a2"), 2), Rec("b", s("b"), 1), Rec("b", None, 3)]}]
    result = run_pipeline([InputDef("T", "timestamped")], tables, runs)["copy"]
    assert result.versions == {"a": [(2, None, s("a2"))]}
    assert result.counts == {"emitted": 4, "accepted_latest": 3, "accepted_out_of_order": 1, "tombstones": 1,
                             "late": 0}
