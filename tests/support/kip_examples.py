"""The normative KIP worked examples (docs/semantics.md, rules 13-18 and 23-30) as data for the derived-table tests.

Each example gives the pipeline (``inputs``, ``tables`` in the shape ``tests.support.derived_reference``
takes), the ``runs`` and the result exactly as the KIP states it. The KIP sequences are *arrival*
orders; they are reproduced by giving each stretch of consecutive records from one input its own
run (docs/semantics.md, rules 13-18 and 23-30, "Processing order across inputs"), so the head-timestamp merge never
reorders them.

The KIP texts (Apache Kafka wiki pages) mix revisions; the comment on each
example says which lines were used and how they were read. Where the KIP and
docs/derived-tables.md disagree, the KIP (+ docs/semantics.md) wins and the comment says so.

Values are simple JSON strings ('"a0"') or numbers where an operator needs them (a sum, a
foreign key).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tests.support.derived_reference import InputDef, Rec

Expected = list[tuple[str, str | None, int]]  # (key, value, timestamp)
ExpectedVersions = dict[str, list[tuple[int, int | None, str | None]]]  # key -> [(from, to, value)]


@dataclass(frozen=True)
class KipExample:
    name: str
    source: str  # the KIP and section
    inputs: list[InputDef]
    tables: list[dict[str, Any]]
    runs: list[dict[str, list[Rec]]]
    emissions: dict[str, Expected]  # table -> expected emissions, in order (stream outputs: its records)
    versions: dict[str, ExpectedVersions] = field(default_factory=dict)  # table -> expected final versions
    normative: bool = True  # False: an illustration from a non-normative part of a KIP


def j(left: str | None, right: str | None) -> str:
    """A join result value, built textually as docs/derived-tables.md "Values" says."""
    return '{"left":' + ("null" if left is None else left) + ',"right":' + ("null" if right is None else right) + "}"


def s(text: str) -> str:
    """A JSON string value: s("a0") == '"a0"'."""
    return '"' + text + '"'


EXAMPLES: list[KipExample] = []

# ------------------------------------------------------------------------------------------------
# KIP-914 "Proposal" (Table-Table Joins Do Not Produce Join Results on Out-of-order Records from
# Versioned Tables), first code block after "Proposal": A join B, both versioned, one key.
#   A: a0@0, A: a5@5, B: b2@2 -> (a5,b2)@5, B: b3@3 -> (a5,b3)@5, B: b4@4 -> (a5,b4)@5,
#   A: a1@1 -> out-of-order on A, no new join result.
# The dump repeats this block twice: once garbled (the wiki diff interleaves it with the
# "Background"/"Attempt 1" example: "B: (timestamp = 20, value = b2b0) ...") and once clean (the
# second "Proposal" heading); the clean copy is the one used. It is an inner join (the KIP says
# "A join B"); a0 and a5 arrive before any B record, so they emit nothing. The three results share
# timestamp 5, so the result store keeps one version (rule 1: same (key, timestamp) replaces).
# ------------------------------------------------------------------------------------------------
_AB = [InputDef("A", "versioned"), InputDef("B", "versioned")]
_AB_INNER: list[dict[str, Any]] = [{"name": "ab", "join": {"left": "A", "right": "B", "type": "inner"}}]

EXAMPLES.append(KipExample(
    name="kip914_proposal_a0_a5_b2_b3_b4_a1",
    source="KIP-914, Proposed Changes > Table-Table Joins ... > Proposal (first example)",
    inputs=_AB,
    tables=_AB_INNER,
    runs=[
        {"A": [Rec("k", s("a0"), 0), Rec("k", s("a5"), 5)]},
        {"B": [Rec("k", s("b2"), 2), Rec("k", s("b3"), 3), Rec("k", s("b4"), 4)]},
        {"A": [Rec("k", s("a1"), 1)]},
    ],
    emissions={"ab": [
        ("k", j(s("a5"), s("b2")), 5),
        ("k", j(s("a5"), s("b3")), 5),
        ("k", j(s("a5"), s("b4")), 5),
    ]},
    versions={"ab": {"k": [(5, None, j(s("a5"), s("b4")))]}},
))

# ------------------------------------------------------------------------------------------------
# KIP-914 "Proposal", second code block ("Note that it's still possible there will be older ...
# join results"): A: a0@0, B: b2@2 -> (a0,b2)@2, A: a5@5 -> (a5,b2)@5, A: a1@1 -> out-of-order on A,
# no new join result ("the older (a0, b2) join result is no longer correct" - which is accepted).
# Inner join as above. a5 and a1 are one stretch of A records, so they share a run.
# ------------------------------------------------------------------------------------------------
EXAMPLES.append(KipExample(
    name="kip914_proposal_a0_b2_a5_a1",
    source="KIP-914, Proposed Changes > Table-Table Joins ... > Proposal (second example)",
    inputs=_AB,
    tables=_AB_INNER,
    runs=[
        {"A": [Rec("k", s("a0"), 0)]},
        {"B": [Rec("k", s("b2"), 2)]},
        {"A": [Rec("k", s("a5"), 5), Rec("k", s("a1"), 1)]},
    ],
    emissions={"ab": [
        ("k", j(s("a0"), s("b2")), 2),
        ("k", j(s("a5"), s("b2")), 5),
    ]},
    versions={"ab": {"k": [(2, 5, j(s("a0"), s("b2"))), (5, None, j(s("a5"), s("b2")))]}},
))

# ------------------------------------------------------------------------------------------------
# KIP-914 "Table Filter Processors Applied to Versioned Tables Do Not Drop Duplicate Tombstones".
# The KIP's table lists the *filter results* (v1, ts=1), (null, ts=2), (null, ts=4), (v2, ts=3) and
# what reaches the downstream table. Read as: the input values at ts=2 and ts=4 fail the predicate
# (here "x2", "x4"), so the filter's result is null for both; v1 and v2 pass. ts=3 arrives last,
# out of order (the input is versioned and filter forwards out-of-order changes too).
# Versioned input (rule 13): every tombstone is forwarded, so the downstream versioned table ends
# with null@4 as its latest version - the correct result the KIP asks for.
# ------------------------------------------------------------------------------------------------
_FILTER = [{"name": "f", "from": "T", "filter": "value = 'v1' or value = 'v2'"}]
_FILTER_RUNS: list[dict[str, list[Rec]]] = [
    {"T": [Rec("k", s("v1"), 1), Rec("k", s("x2"), 2), Rec("k", s("x4"), 4), Rec("k", s("v2"), 3)]},
]

EXAMPLES.append(KipExample(
    name="kip914_filter_versioned_keeps_duplicate_tombstones",
    source="KIP-914, Table Filter Processors Applied to Versioned Tables Do Not Drop Duplicate Tombstones",
    inputs=[InputDef("T", "versioned")],
    tables=_FILTER,
    runs=_FILTER_RUNS,
    emissions={"f": [("k", s("v1"), 1), ("k", None, 2), ("k", None, 4), ("k", s("v2"), 3)]},
    versions={"f": {"k": [(1, 2, s("v1")), (2, 3, None), (3, 4, s("v2")), (4, None, None)]}},
))

# Same records, non-versioned (timestamped) input: Kafka's optimisation stays on, (null, ts=4) is
# "[n/a]" - not forwarded because the previous filter result (ts=2) was also null - and the
# downstream table wrongly shows v2@3 as latest ("With the optimization enabled ..." paragraph).
EXAMPLES.append(KipExample(
    name="kip914_filter_timestamped_drops_duplicate_tombstone",
    source="KIP-914, Table Filter Processors ... (the 'With the optimization enabled' paragraph)",
    inputs=[InputDef("T", "timestamped")],
    tables=_FILTER,
    runs=_FILTER_RUNS,
    emissions={"f": [("k", s("v1"), 1), ("k", None, 2), ("k", s("v2"), 3)]},
    versions={"f": {"k": [(1, 2, s("v1")), (2, 3, None), (3, None, s("v2"))]}},
))

# ------------------------------------------------------------------------------------------------
# KIP-914 "Table Aggregations Ignore Out-of-order Records from Versioned Tables":
#   (v1, ts=1)  add: v1              | add: v1
#   (v2, ts=10) remove: v1 ; add: v2 | remove: v1 ; add: v2
#   (v3, ts=5)  remove: v2 ; add: v3 | nothing -- v3 has an older timestamp than v2
# Read with v1=1, v2=10, v3=5 (numbers, so the effect is visible in a sum) and the group = the
# record's key, so "remove; add" is one atomic update of one group (KIP-904) and one emission.
# Aggregate timestamps: max(record ts, the group's previous ts), so the unversioned third update is
# stamped 10 and replaces the ts=10 version of the result.
# ------------------------------------------------------------------------------------------------
_AGG = [{"name": "agg", "from": "T", "group_by": "key", "aggregate": {"count": True, "sum": "value"}}]
_AGG_RUNS: list[dict[str, list[Rec]]] = [{"T": [Rec("k", "1", 1), Rec("k", "10", 10), Rec("k", "5", 5)]}]

EXAMPLES.append(KipExample(
    name="kip914_aggregate_versioned_ignores_out_of_order",
    source="KIP-914, Table Aggregations Ignore Out-of-order Records from Versioned Tables (versioned column)",
    inputs=[InputDef("T", "versioned")],
    tables=_AGG,
    runs=_AGG_RUNS,
    emissions={"agg": [("k", '{"count":1,"sum":1}', 1), ("k", '{"count":1,"sum":10}', 10)]},
    versions={"agg": {"k": [(1, 10, '{"count":1,"sum":1}'), (10, None, '{"count":1,"sum":10}')]}},
))

EXAMPLES.append(KipExample(
    name="kip914_aggregate_unversioned_applies_out_of_order",
    source="KIP-914, Table Aggregations Ignore Out-of-order Records ... (unversioned column)",
    inputs=[InputDef("T", "timestamped")],
    tables=_AGG,
    runs=_AGG_RUNS,
    emissions={"agg": [
        ("k", '{"count":1,"sum":1}', 1),
        ("k", '{"count":1,"sum":10}', 10),
        ("k", '{"count":1,"sum":5}', 10),
    ]},
    versions={"agg": {"k": [(1, 10, '{"count":1,"sum":1}'), (10, None, '{"count":1,"sum":5}')]}},
))

# ------------------------------------------------------------------------------------------------
# KIP-914 "Stream-Table Joins Perform Timestamped Lookups on Versioned Tables". The KIP gives no
# data, only the rule: the stream record joins get(key, streamTimestamp); when that returns null
# (including "older than the versioned store's history retention") an inner join emits nothing and
# a left join emits the record with a null table value. The data below is ours; the normative
# details are docs/semantics.md rules 7-8, rule 14 and "Operator details": beyond retention the latest
# version still joins when its timestamp <= the stream record's (as Kafka's RocksDB versioned
# store's get(key, t) does: the latest version never expires), and null-valued stream records
# are skipped.
# Table T (retention 10): k: t1@1, t5@5, t30@30; m: m1@1 -> stream time 30, horizon 20.
#   k s25@25: as of 25 (>= 20) -> t5 (the version valid at 25, not the latest t30)
#   k s3@3:   3 < 20 and k's latest (t30@30) is newer than 3 -> expired: inner nothing, left null
#   m s4@4:   4 < 20 but m's latest (m1@1) is <= 4 -> joins m1
#   j s26@26: no version -> inner nothing, left null
#   k null@27: skipped
#   k s31@31: t30
# ------------------------------------------------------------------------------------------------
_STREAM_JOIN_TABLES: list[dict[str, Any]] = [
    {"name": "inner", "stream_join": {"stream": "S", "table": "T", "type": "inner"}},
    {"name": "left", "stream_join": {"stream": "S", "table": "T", "type": "left"}},
]
EXAMPLES.append(KipExample(
    name="kip914_stream_table_join_as_of",
    source="KIP-914, Stream-Table Joins Perform Timestamped Lookups on Versioned Tables (+ docs/semantics.md rule 8)",
    inputs=[InputDef("T", "versioned", history_retention_ms=10), InputDef("S", "stream")],
    tables=_STREAM_JOIN_TABLES,
    runs=[
        {"T": [Rec("k", s("t1"), 1), Rec("k", s("t5"), 5), Rec("m", s("m1"), 1), Rec("k", s("t30"), 30)]},
        {"S": [Rec("k", s("s25"), 25), Rec("k", s("s3"), 3), Rec("m", s("s4"), 4), Rec("j", s("s26"), 26),
               Rec("k", None, 27), Rec("k", s("s31"), 31)]},
    ],
    emissions={
        "inner": [
            ("k", j(s("s25"), s("t5")), 25),
            ("m", j(s("s4"), s("m1")), 4),
            ("k", j(s("s31"), s("t30")), 31),
        ],
        "left": [
            ("k", j(s("s25"), s("t5")), 25),
            ("k", j(s("s3"), None), 3),
            ("m", j(s("s4"), s("m1")), 4),
            ("j", j(s("s26"), None), 26),
            ("k", j(s("s31"), s("t30")), 31),
        ],
    },
))

# ------------------------------------------------------------------------------------------------
# KIP-904 "Affected Public Interfaces": table(input).groupBy(KeyValue::pair).count() with
#   ("1", "", 8), ("1", "", 9)  ->  ("1", 1, 8), ("1", 1, 9)    (the transient ("1", 0, 9) is gone)
# KeyValue::pair keeps the key, so group_by "key"; the value "" is the JSON string '""'. The KIP's
# input table is a plain (unversioned) table: kind timestamped. Count-only aggregate values are
# {"count": n}.
# ------------------------------------------------------------------------------------------------
EXAMPLES.append(KipExample(
    name="kip904_count_no_transient_state",
    source="KIP-904, Affected Public Interfaces (KGroupedTable count example)",
    inputs=[InputDef("input", "timestamped")],
    tables=[{"name": "output", "from": "input", "group_by": "key", "aggregate": {"count": True}}],
    runs=[{"input": [Rec("1", '""', 8), Rec("1", '""', 9)]}],
    emissions={"output": [("1", '{"count":1}', 8), ("1", '{"count":1}', 9)]},
    versions={"output": {"1": [(8, 9, '{"count":1}'), (9, None, '{"count":1}')]}},
))

# ------------------------------------------------------------------------------------------------
# KIP-213, "The workflow of LHS-generated changes to outputs" table (current proposal, not Jan
# Filipiak's original at the end of the file). Rows, with the KIP's (key, fk, rhs-value) outputs:
#   (RHS-0 already holds (1,foo))
#   1 Publish new event (k,1)              inner (k,1,foo)   left (k,1,foo)
#   2 change fk (k,1) -> (k,2)             inner (k,null)    left (k,2,null)
#   3 change fk (k,2) -> (k,3)             inner (k,null)    left (k,3,null)
#   4 Publish a value to RHS (3,bar)       inner (k,3,bar)   left (k,3,bar)
#   5 Delete k (k,3) -> (k,null)           inner (k,null)    left (k,null,null)
#   6 Publish original event again (k,1)   inner (k,1,foo)   left (k,1,foo)
#   7 Publish to LHS (q,10)                inner Nothing     left (q,10,null)
#   8 Publish a value to RHS-1             inner (q,10,baz)  left (q,10,baz)
# Reading: the left value *is* the foreign key (a JSON number, foreign_key "value"); right values
# are strings. "(k,null)" and "(k,null,null)" are tombstones for k. Row 8's RHS state reads
# "(q,baz)", a typo for (10,baz): the outputs (q,10,baz) need right key 10. The KIP has no
# timestamps: records are stamped 0 (the pre-existing (1,foo)), then 1..8 in row order, each
# stretch of one side is its own run. Result timestamps follow the floor rule: max(trigger, other
# side, previous result).
# DISAGREEMENT with docs/derived-tables.md: row 7, inner join emits *nothing* (a new left key with
# no match), where the docs' fk_join rule ("inner: join(a, b), or a tombstone when b is null")
# would emit a tombstone (q, null)@7. KIP wins: tests.support.derived_reference emits nothing for an inner
# left change whose old value is null and that has no match (row 3 shows an *update* does retract).
# ------------------------------------------------------------------------------------------------
_LR = [InputDef("L", "versioned"), InputDef("R", "versioned")]
_KIP213_TABLES: list[dict[str, Any]] = [
    {"name": "inner", "fk_join": {"left": "L", "right": "R", "foreign_key": "value", "type": "inner"}},
    {"name": "left", "fk_join": {"left": "L", "right": "R", "foreign_key": "value", "type": "left"}},
]
EXAMPLES.append(KipExample(
    name="kip213_lhs_event_table",
    source="KIP-213, Tombstones & Foreign Key Changes: LHS-generated changes table (Inner/Left Join Output)",
    inputs=_LR,
    tables=_KIP213_TABLES,
    runs=[
        {"R": [Rec("1", s("foo"), 0)]},
        {"L": [Rec("k", "1", 1), Rec("k", "2", 2), Rec("k", "3", 3)]},
        {"R": [Rec("3", s("bar"), 4)]},
        {"L": [Rec("k", None, 5), Rec("k", "1", 6), Rec("q", "10", 7)]},
        {"R": [Rec("10", s("baz"), 8)]},
    ],
    emissions={
        "inner": [
            ("k", j("1", s("foo")), 1),
            ("k", None, 2),
            # a second tombstone, as the KIP's table shows and Kafka 4.3.1 emits: the foreign key
            # moved (2 -> 3) to a key without a match, and Kafka's subscription protocol cannot
            # know the result was already retracted (rule 27)
            ("k", None, 3),
            ("k", j("3", s("bar")), 4),
            ("k", None, 5),
            ("k", j("1", s("foo")), 6),
            ("q", j("10", s("baz")), 8),
        ],
        "left": [
            ("k", j("1", s("foo")), 1),
            ("k", j("2", None), 2),
            ("k", j("3", None), 3),
            ("k", j("3", s("bar")), 4),
            ("k", None, 5),
            ("k", j("1", s("foo")), 6),
            ("q", j("10", None), 7),
            ("q", j("10", s("baz")), 8),
        ],
    },
    versions={
        "inner": {
            "k": [(1, 2, j("1", s("foo"))), (2, 3, None), (3, 4, None), (4, 5, j("3", s("bar"))), (5, 6, None),
                  (6, None, j("1", s("foo")))],
            "q": [(8, None, j("10", s("baz")))],
        },
        "left": {
            "k": [(1, 2, j("1", s("foo"))), (2, 3, j("2", None)), (3, 4, j("3", None)), (4, 5, j("3", s("bar"))),
                  (5, 6, None), (6, None, j("1", s("foo")))],
            "q": [(7, 8, j("10", None)), (8, None, j("10", s("baz")))],
        },
    },
))

# ------------------------------------------------------------------------------------------------
# Non-normative illustration: KIP-213 "Original Value Hash" example (RHS Y|bar; LHS A|Y,1 then
# A|Y,2). The race it describes cannot happen in a synchronous topology: every result is computed
# from the current left value, so the results are exactly the two correct ones, A|Y,1,bar then
# A|Y,2,bar (stale-result elimination by construction, rule 16).
# ------------------------------------------------------------------------------------------------
_A1 = '{"fk":"Y","n":1}'
_A2 = '{"fk":"Y","n":2}'
EXAMPLES.append(KipExample(
    name="kip213_original_value_hash_no_stale_result",
    source="KIP-213, Joiner Propagation of Stale Data > Original Value Hash (illustration, not normative)",
    inputs=_LR,
    tables=[{"name": "inner", "fk_join": {"left": "L", "right": "R", "foreign_key": "value.fk", "type": "inner"}}],
    runs=[{"R": [Rec("Y", s("bar"), 0)]}, {"L": [Rec("A", _A1, 1), Rec("A", _A2, 2)]}],
    emissions={"inner": [("A", j(_A1, s("bar")), 1), ("A", j(_A2, s("bar")), 2)]},
    versions={"inner": {"A": [(1, 2, j(_A1, s("bar"))), (2, None, j(_A2, s("bar")))]}},
    normative=False,
))
