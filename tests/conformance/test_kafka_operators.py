"""Differential test of the derived-table operators against Kafka Streams itself (issue 13).

Random changelogs (out of order, late past the inputs' grace, same-timestamp replacements,
tombstones, odd values), split at random into runs, go through versiq's real pipeline (Spark
ingest of the inputs, the derived phase) and through the same operator in real Kafka Streams
(``conformance/kafka``, OperatorScenarios.java: KTables over RocksDB versioned or timestamped
stores, TopologyTestDriver): table filter; primary-key inner, left and outer joins; foreign-key
inner and left joins; groupBy + count, sum, a custom aggregate (string building with
``concat``) and reduce (``int``, ``%``, ``substring``, ``length`` in its group key); groupBy + count
or sum whose result table is joined (primary key, inner, left or outer) with a second input
keyed by group (``aggregate_join``: the join's emissions and result table are compared; the
aggregate's own are those of the aggregate operator); groupBy + count, or count and sum, whose
result table's rows are grouped again by a function of their aggregate (how many of the
scenario's groups have each count) into a count, a sum or both (``aggregate_twice``: both
aggregates' emissions and result tables are compared); stream-table inner and left joins. Every
emission (key, value, timestamp, in order) and the final result table are compared.

The documented departures (docs/semantics.md, "Departures"), applied exactly and nothing looser:
- Processing order across inputs within a run is versiq's merge (rule 23): Kafka is given the
  records in exactly that order (runs in sequence; within a run the smallest head timestamp
  first, ties to the input declared first, stores before streams). aggregate_join with several
  partitions is processed after a repartition: Kafka is given the order of the group's
  partition, its group updates merged with the second input's records by head timestamp, ties
  to the records (``repartition_order``).
- Result timestamps are floored per key (rule 26): a join or aggregate result carries at least
  the timestamp of the key's previous result. Kafka's emission timestamps are floored by the
  key's previous emissions before comparing; where that floor changed a timestamp, Kafka's own
  versioned result store keeps the older-timestamped result as history, so its latest record
  is compared with the last emission instead.

Layout: scenarios with the same operator settings share one versiq pipeline group (a name
prefix); scenario j owns partition j of each input store, keys and foreign/group keys prefixed
``s<j>/`` (``scenario_key``: keys of stream-table joins get a suffix that puts them in partition
j by Kafka's partitioner, as the stream's records are) and timestamps shifted by ``j * SPAN``
(all of scenario j's records precede scenario j+1's in every input, so the merge restricted to
one scenario is the merge of it alone). Filters, primary-key joins and stream-table joins run one
topology per partition (rule 23), so each scenario is processed alone, as in Kafka's one task.
Aggregates run in the same partitions, their group updates crossing a repartition to the
partition of their (prefixed) group: a group's updates all come from its scenario's partition,
in its order, so each group sees exactly what it sees in Kafka's one task; the table's emissions
are in partition order, so both sides' emissions are compared partition by partition (a stable
sort by the group's partition: Kafka Streams with several partitions orders emissions only
within a task). aggregate_join's groups and its second input's keys are pinned to the scenario's
partition (``scenario_key``): the join runs there, after the repartition, over the updates of
the scenario's groups and the second input's records of that partition, which are the
scenario's only, so its stream time and grace are the scenario's, as in Kafka's one task.
aggregate_twice's first groups are pinned to the scenario's partition too (``pinned_group``): the
second group-by's updates are made there, in the first aggregate's emission order, as in Kafka's
one task, where each change crosses both repartition topics before the next record is taken.
Were the first groups spread over partitions, a second group would get updates from each of
them, merged by head timestamp (rule 23), which Kafka's one task does not do (its order is the
records'; Kafka with several tasks interleaves a repartition topic's writers as they come), so
no scenario could be judged as in one task. The second groups are not pinned: each gets its
updates from partition j alone, in order, wherever it lives, and the second aggregate's
emissions are compared partition by partition as the aggregate's are. Kafka is given the
records' order (one input: the runs in turn).
Foreign-key joins run in the left store's partitions, each reading the right store whole (its
records of the run in the store's own order, scenario after scenario): partition j's join
answers only scenario j's left keys, and the other scenarios' right records, in time bands of
their own, come wholly before or after scenario j's, so each scenario is again processed alone.
Kafka runs every group of scenarios in one TopologyTestDriver with the same prefixed (pinned),
shifted records.

``make test`` runs 32 per operator from a fixed seed; ``make conformance`` runs
``VERSIQ_CONFORMANCE_SCENARIOS`` (default 10,000) per operator from a fresh seed
(``VERSIQ_CONFORMANCE_SEED`` repeats one; tests/support/conformance.py) and prints a summary.
"""

from __future__ import annotations

import functools
import heapq
import json
import os
import random
from collections import Counter
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pytest

from tests.support.conformance import (
    TimeLimit,
    append_report,
    backstop_s,
    conformance_seed,
    repeat_hint,
    time_limit_s,
)
from tests.support.derived import Observed, RealPipeline
from tests.support.derived_reference import InputDef, Rec
from tests.support.derived_reference import Pipeline as RefPipeline
from tests.support.kafka_streams import KAFKA_VERSION, kafka_loses_replaced_tombstone, run_operator_scenarios
from versiq.ingest.derived.expressions import Expression
from versiq.layout import MURMUR2, default_partition_of

OPS = ("filter", "join", "fk_join", "aggregate", "aggregate_join", "aggregate_twice", "stream_join")
#: The operators run (VERSIQ_CONFORMANCE_OPERATORS, comma-separated: a subset of OPS; default all).
#: A subset draws different scenarios for the operators after the first one left out.
OPERATORS = tuple(op.strip() for op in os.environ.get("VERSIQ_CONFORMANCE_OPERATORS", ",".join(OPS)).split(",")
                  if op.strip())
assert set(OPERATORS) <= set(OPS), f"VERSIQ_CONFORMANCE_OPERATORS: not operators {sorted(set(OPERATORS) - set(OPS))}"
#: Scenarios per operator: 32 in ``make test``; ``make conformance`` sets VERSIQ_CONFORMANCE_SCENARIOS.
PER_OPERATOR = int(os.environ.get("VERSIQ_CONFORMANCE_SCENARIOS", "32"))
#: Scenarios per versiq pipeline group and groups per Spark run (one batch).
#: 32 in ``make test``: one group per operator (each group's tables cost commits in every run, so
#: fewer, larger groups make the same scenarios quicker); ``make conformance``: 500.
GROUP_SIZE = int(os.environ.get("VERSIQ_CONFORMANCE_GROUP", "32"))
GROUPS_PER_BATCH = int(os.environ.get("VERSIQ_CONFORMANCE_GROUPS", "14"))  # make test: one batch
SPAN = 1000  # timestamp shift between scenarios of one group (a scenario's records are in [0, 40])
OUTPUT_RETENTION_MS = 10**12  # results are never late for the result table itself
RETENTIONS = (0, 4, 15, 1000)
REDUCE_GROUP = "concat(substring(key, 1, length(key) - 2), int(value) % 3)"
AGGREGATORS: dict[str, dict[str, Any]] = {
    "count": {"group_by": "value.g", "aggregate": {"count": True}},
    "sum": {"group_by": "value.g", "aggregate": {"sum": "value.n"}},
    "concat": {"group_by": "value.g", "aggregate": {"init": '"0"', "add": 'concat(agg, "+", value.n)',
                                                    "subtract": 'concat(agg, "-", value.n)'}},
    "reduce": {"group_by": REDUCE_GROUP, "reduce": {"add": "agg + value", "subtract": "agg - value"}},
}
GROUPS = ("x", "y")  # the groups of value.g (``_object_value``); aggregate_join's input 1 also has z
#: aggregate_twice's first aggregates (grouped by value.g, as AGGREGATORS) and second ones.
FIRST_AGGREGATES: dict[str, dict[str, Any]] = {"count": {"count": True}, "count_sum": {"count": True, "sum": "value.n"}}
REGROUP_AGGREGATES: dict[str, dict[str, Any]] = {"count": {"count": True}, "sum": {"sum": "value.sum"},
                                                 "count_sum": {"count": True, "sum": "value.sum"}}
#: aggregate_twice's second group key: how many of the scenario's groups have each count. A first
#: group is ``pinned_group``'s ``s<j>/x~NNNN``: without its 6-character tail, the scenario's prefix.
REGROUP = 'concat(substring(key, 1, length(key) - 6), "c", value.count)'


@dataclass(frozen=True)
class Config:
    """The operator settings a group of scenarios shares (one versiq pipeline group)."""

    op: str
    join_type: str
    kinds: tuple[str, ...]  # per input: versioned, timestamped or stream
    retentions: tuple[int, ...]
    aggregator: str = ""
    regroup: str = ""  # aggregate_twice: the second aggregate (REGROUP_AGGREGATES)

    def kafka(self) -> dict[str, Any]:
        out: dict[str, Any] = {"op": self.op, "type": self.join_type, "outputRetentionMs": OUTPUT_RETENTION_MS,
                               "outputKind": "timestamped" if self.op in ("aggregate", "aggregate_twice")
                               else "versioned",
                               "inputs": [{"kind": k, "historyRetentionMs": r}
                                          for k, r in zip(self.kinds, self.retentions, strict=True)]}
        if self.op == "filter":
            out["filter"] = "value.n > 3"
        if self.op == "fk_join":
            out["foreignKey"] = "value.f"
        if self.op in ("aggregate", "aggregate_join"):
            out["groupBy"] = AGGREGATORS[self.aggregator]["group_by"]
            out["aggregator"] = self.aggregator
        if self.op == "aggregate_twice":
            out.update(groupBy="value.g", aggregator=self.aggregator, sumOf="value.n", regroupBy=REGROUP,
                       regroupAggregator=self.regroup, regroupSumOf="value.sum")
        return out

    def tables(self) -> list[dict[str, Any]]:
        """The versiq ``tables:`` entries of the group, the last one the compared result table
        ``out`` (aggregate_join: the aggregate ``agg``, then ``out``, its join with input 1;
        aggregate_twice: the aggregate ``agg``, then ``out``, its rows grouped again)."""
        retention = {"history_retention_ms": OUTPUT_RETENTION_MS}
        if self.op == "filter":
            return [{"name": "out", "from": "i0", "filter": "value.n > 3", **retention}]
        if self.op == "join":
            return [{"name": "out", "join": {"left": "i0", "right": "i1", "type": self.join_type}, **retention}]
        if self.op == "fk_join":
            return [{"name": "out", "fk_join": {"left": "i0", "right": "i1", "foreign_key": "value.f",
                                                "type": self.join_type}, **retention}]
        if self.op == "aggregate":
            return [{"name": "out", "from": "i0", **AGGREGATORS[self.aggregator], **retention}]
        if self.op == "aggregate_join":
            return [{"name": "agg", "from": "i0", **AGGREGATORS[self.aggregator], **retention},
                    {"name": "out", "join": {"left": "agg", "right": "i1", "type": self.join_type}, **retention}]
        if self.op == "aggregate_twice":
            return [{"name": "agg", "from": "i0", "group_by": "value.g", "aggregate": FIRST_AGGREGATES[self.aggregator],
                     **retention},
                    {"name": "out", "from": "agg", "group_by": REGROUP, "aggregate": REGROUP_AGGREGATES[self.regroup],
                     **retention}]
        return [{"name": "out", "stream_join": {"stream": "i0", "table": "i1", "type": self.join_type}}]


def random_config(rng: random.Random, op: str) -> Config:
    table_kind = lambda: rng.choice(("versioned", "versioned", "timestamped"))  # noqa: E731
    retention = lambda: rng.choice(RETENTIONS)  # noqa: E731
    if op == "filter":
        return Config(op, "", (table_kind(),), (retention(),))
    if op in ("join", "fk_join"):
        join_type = rng.choice(("inner", "left", "outer") if op == "join" else ("inner", "left"))
        return Config(op, join_type, (table_kind(), table_kind()), (retention(), retention()))
    if op == "aggregate":
        return Config(op, "", (table_kind(),), (retention(),), rng.choice(sorted(AGGREGATORS)))
    if op == "aggregate_join":
        return Config(op, rng.choice(("inner", "left", "outer")), (table_kind(), table_kind()),
                      (retention(), retention()), rng.choice(("count", "sum")))
    if op == "aggregate_twice":
        return Config(op, "", (table_kind(),), (retention(),), rng.choice(sorted(FIRST_AGGREGATES)),
                      rng.choice(sorted(REGROUP_AGGREGATES)))
    return Config(op, rng.choice(("inner", "left")), ("stream", table_kind()), (0, retention()))


def _object_value(rng: random.Random) -> str | None:
    """A record value; ``@`` stands for the scenario's key prefix (versiq) or nothing (Kafka)."""
    roll = rng.random()
    if roll < 0.2:
        return None
    if roll < 0.25:
        return rng.choice(['"s"', "7", "[1]"])  # not an object: every path is null
    member: dict[str, str] = {}
    f = rng.choice(["k1", "k2", "k3", None])
    member["f"] = "null" if f is None else json.dumps("@" + f)
    member["g"] = json.dumps("@" + rng.choice(GROUPS))
    if rng.random() < 0.9:
        member["n"] = rng.choice([str(rng.randint(-3, 12)), "1.5", "2.25", "0.10", "12.0"])
    return "{" + ",".join(f'"{k}":{v}' for k, v in member.items()) + "}"


def _number_value(rng: random.Random) -> str | None:
    if rng.random() < 0.2:
        return None
    return rng.choice([str(rng.randint(-5, 9)), "1.5", "0.10", "2.25", "-3.5"])


Runs = list[dict[int, list[tuple[str, str | None, int]]]]


def random_runs(rng: random.Random, config: Config) -> Runs:
    """Random records per input (keys k1..k3, timestamps 0..40) in random arrival order, cut into
    up to three runs. aggregate_join's input 1 is keyed by group (x, y, and z, no group's)."""
    value = _number_value if config.aggregator == "reduce" else _object_value

    def keys(i: int) -> tuple[str, ...]:
        return (*GROUPS, "z") if config.op == "aggregate_join" and i == 1 else ("k1", "k2", "k3")

    arrivals = [(i, (rng.choice(keys(i)), value(rng), rng.randint(0, 40)))
                for i in range(len(config.kinds)) for _ in range(rng.randint(0, 8))]
    rng.shuffle(arrivals)
    cuts = sorted({rng.randint(1, max(1, len(arrivals) - 1)) for _ in range(rng.randint(0, 2))})
    runs: Runs = []
    start = 0
    for end in [*cuts, len(arrivals)]:
        run: dict[int, list[tuple[str, str | None, int]]] = {}
        for i, rec in arrivals[start:end]:
            run.setdefault(i, []).append(rec)
        if run:
            runs.append(run)
        start = end
    return runs


def merge_order(config: Config, runs: Runs) -> list[tuple[int, tuple[str, str | None, int]]]:
    """Rule 23: runs in sequence; within a run the head with the smallest timestamp goes next,
    ties to the input declared first (the pipeline declares stores before streams)."""
    rank = sorted(range(len(config.kinds)), key=lambda i: (config.kinds[i] == "stream", i))
    out = []
    for run in runs:
        heads = [(recs[0][2], rank.index(i), i, 0) for i, recs in run.items() if recs]
        heapq.heapify(heads)
        while heads:
            _, r, i, pos = heapq.heappop(heads)
            out.append((i, run[i][pos]))
            if pos + 1 < len(run[i]):
                heapq.heappush(heads, (run[i][pos + 1][2], r, i, pos + 1))
    return out


def kafka_order(config: Config, runs: Runs, partitions: int) -> list[tuple[int, tuple[str, str | None, int]]]:
    """The order Kafka is given a scenario's records in: the order versiq processes them. That is
    the merge (``merge_order``), except for aggregate_join with several partitions, where the
    join runs after a repartition: see ``repartition_order``."""
    if config.op == "aggregate_join" and partitions > 1:
        return repartition_order(config, runs)
    return merge_order(config, runs)


def repartition_order(config: Config, runs: Runs) -> list[tuple[int, tuple[str, str | None, int]]]:
    """aggregate_join's order with several partitions (rule 23, "Partitions"): per run, the
    scenario's partition routes its input-0 records, in their order, to group updates (stamped
    with their record's timestamp); its groups' partition, the same one (``scenario_key`` pins
    the groups and input 1's keys there), merges those updates with its input-1 records by head
    timestamp, ties to the records. The merge of the input-0 *records* would not do: a record
    that makes no update (late, out of order in a versioned input, no group in its old or new
    value) is no head of that merge, yet can hold back input 1's records in the merge of records.
    Which records make updates is the reference model's (tests/support/derived_reference.py); a
    record that makes none changes nothing but input 0's own store, so it goes just before the
    next one that does, keeping input 0's order."""
    routes = RefPipeline([InputDef("i0", config.kinds[0], history_retention_ms=config.retentions[0])],
                         config.tables()[:1])
    routes.routed = {"agg": []}
    out: list[tuple[int, tuple[str, str | None, int]]] = []
    for run in runs:
        records, pending, b = run.get(1, []), [], 0
        for rec in run.get(0, []):
            routes.process_run({"i0": [Rec(*rec)]})
            pending.append((0, rec))
            if routes.routed["agg"]:  # the updates of ``rec``: the head of the updates is rec's timestamp
                while b < len(records) and records[b][2] <= rec[2]:
                    out.append((1, records[b]))
                    b += 1
                out += pending
                pending = []
        out += [(1, rec) for rec in records[b:]] + pending
    return out


def _floor(emitted: list[dict[str, Any]]) -> tuple[list[tuple[str, str | None, int]], set[str]]:
    """Kafka's emissions with timestamps floored per key (rule 26), and the keys the floor changed."""
    newest: dict[str, int] = {}
    floored, changed = [], set()
    for e in emitted:
        ts = max(e["ts"], newest.get(e["key"], e["ts"]))
        if ts != e["ts"]:
            changed.add(e["key"])
        newest[e["key"]] = ts
        floored.append((e["key"], e["value"], ts))
    return floored, changed


def _kafka_value(config: Config, value: str | None) -> str | None:
    """Kafka's result-store value as versiq renders the aggregate (count is a Long in Kafka,
    count_sum the text ``count,sum``)."""
    if value is None or config.op not in ("aggregate", "aggregate_twice"):
        return value
    aggregator = config.regroup if config.op == "aggregate_twice" else config.aggregator
    if aggregator == "count":
        return '{"count":' + value + "}"
    if aggregator == "sum":
        return '{"sum":' + value + "}"
    if aggregator == "count_sum":
        count, total = value.split(",", 1)
        return '{"count":' + count + ',"sum":' + total + "}"
    if aggregator == "concat":
        return json.dumps(value)
    return value


def compare_scenario(config: Config, kafka: dict[str, Any], emissions: list[tuple[str, str | None, int]],
                     latest: dict[str, tuple[str | None, int]]) -> list[str]:
    """The differences between Kafka's answer and versiq's (unprefixed, unshifted) for one scenario."""
    problems = []
    floors = config.op in ("join", "fk_join", "aggregate", "aggregate_join", "aggregate_twice")
    if floors:
        theirs, changed = _floor(kafka["emitted"])
    else:
        theirs, changed = [(e["key"], e["value"], e["ts"]) for e in kafka["emitted"]], set()
    if emissions != theirs:
        problems.append(f"emissions: kafka {theirs} versiq {emissions}")
    if config.op == "stream_join":
        return problems
    forgotten = kafka_loses_replaced_tombstone({"records": theirs, "partitions": 1, "retention": OUTPUT_RETENTION_MS})
    for key, stored in kafka["latest"].items():
        kafka_latest = None if stored is None else (_kafka_value(config, stored["value"]), stored["ts"])
        mine = latest.get(key)
        if not floors:  # filter: versiq's versioned result is Kafka's versioned result store
            if key in forgotten:
                continue  # Kafka's result store forgot a replaced tombstone (the store test's finding)
            if (mine if kafka_latest is not None else (mine and mine[0])) != kafka_latest:
                problems.append(f"result table, key {key}: kafka {kafka_latest} versiq {mine}")
            continue
        last = next((value, ts) for k, value, ts in reversed(theirs) if k == key)
        if key not in changed and kafka_latest != (last if last[0] is not None else None):
            problems.append(f"kafka's result store, key {key}: {kafka_latest}, its last emission {last}")
        if mine != last:  # versiq's result is the key's last (floored) emission
            problems.append(f"result table, key {key}: kafka (last emission, floored) {last} versiq {mine}")
    return problems


def kafka_forgets_a_tombstone(config: Config, runs: Runs) -> bool:
    """Whether a versioned input of the scenario meets the Kafka 4.3.1 behaviour the store
    conformance test found (a tombstone that replaced a value at the same timestamp is forgotten
    once an older record arrives): such scenarios are set aside and counted, never compared."""
    order = merge_order(config, runs)
    return any(kafka_loses_replaced_tombstone({
        "kind": kind, "partitions": 1, "retention": config.retentions[i],
        "records": [rec for j, rec in order if j == i]}) for i, kind in enumerate(config.kinds))


def _versiq_answer(observed: Observed, prefix: str, shift: int) -> tuple[list[tuple[str, str | None, int]],
                                                                    dict[str, tuple[str | None, int]]]:
    """One scenario's part of a versiq table (``RealPipeline.observed``), unprefixed and unshifted:
    its emissions in order and its latest version per key."""
    emissions = [(local_key(k, prefix), None if v is None else v.replace(prefix, ""), ts - shift)
                 for k, v, ts, _ in observed.emissions if k.startswith(prefix)]
    latest = {}
    for key, versions in observed.versions.items():
        if key.startswith(prefix):
            ts, _, value = max(versions, key=lambda v: v[0])
            value = None if value is None else value.replace(prefix, "")
            latest[local_key(key, prefix)] = (value, ts - shift)
    return emissions, latest


def _local_answer(answer: dict[str, Any], prefix: str, shift: int) -> dict[str, Any]:
    """One scenario's part of a group's Kafka answer, unprefixed and unshifted."""
    def local(value: str | None) -> str | None:
        return None if value is None else value.replace(prefix, "")
    emitted = [{"key": local_key(e["key"], prefix), "value": local(e["value"]), "ts": e["ts"] - shift}
               for e in answer["emitted"] if e["key"].startswith(prefix)]
    latest = {local_key(key, prefix): None if r is None else {"value": local(r["value"]), "ts": r["ts"] - shift}
              for key, r in answer.get("latest", {}).items() if key.startswith(prefix)}
    return {"emitted": emitted, "latest": latest}


@functools.cache
def scenario_key(j: int, key: str, partitions: int, pin: bool) -> str:
    """Scenario j's name for ``key``: ``s<j>/key``; pinned (``pin``) in a group with several
    partitions, with a suffix ``~n`` that puts it in partition j by Kafka's default partitioner:
    the keys of a stream input, where a stream record is processed (docs/semantics.md, rule 23),
    so that the stream's records meet the table's, which scenario j keeps in partition j; and
    aggregate_join's groups and input 1's keys, so that the group updates go to partition j,
    where input 1's records are (input 1 keeps its stream time and grace per partition, as
    Kafka's one task keeps it per scenario only if a partition holds one scenario)."""
    name = f"s{j}/{key}"
    if not pin or partitions == 1:
        return name
    n = 0
    while default_partition_of(name, partitions, MURMUR2) != j:
        n += 1
        name = f"s{j}/{key}~{n}"
    return name


@functools.cache
def pinned_group(j: int, group: str, partitions: int) -> str:
    """aggregate_twice's name for scenario j's group: ``s<j>/<group>~NNNN``, the first four-digit
    pin that puts it in partition j by Kafka's default partitioner (``0000`` with one partition).
    Pinned, the scenario's first groups are all in its partition, which routes their changes to
    the second group-by in their order, as Kafka's one task does: groups in other partitions
    would each route their own, merged by head timestamp where the second groups' updates meet
    (rule 23). Always four digits: the second group key (``REGROUP``) drops the fixed tail."""
    for n in range(10_000):
        name = f"s{j}/{group}~{n:04d}"
        if partitions == 1 or default_partition_of(name, partitions, MURMUR2) == j:
            return name
    raise AssertionError(f"no pin puts {group} in partition {j} of {partitions}")  # pragma: no cover


def local_key(key: str, prefix: str) -> str:
    """The scenario's own name of a key (``scenario_key`` undone)."""
    return key[len(prefix):].split("~")[0]


def scenario_record(config: Config, j: int, partitions: int, i: int, key: str,
                    value: str | None) -> tuple[str, str | None]:
    """Scenario j's key and value for a record of input i, the same for versiq and Kafka: keys
    ``scenario_key``, ``@`` in values the prefix ``s<j>/`` (aggregate_join: groups pinned by
    ``scenario_key``, aggregate_twice by ``pinned_group``)."""
    pinned = "stream" in config.kinds or (config.op == "aggregate_join" and i == 1)
    if value is not None:
        value = value.replace("@", f"s{j}/")
        if config.op == "aggregate_join":
            for group in GROUPS:
                value = value.replace(json.dumps(f"s{j}/{group}"), json.dumps(scenario_key(j, group, partitions, True)))
        if config.op == "aggregate_twice":
            for group in GROUPS:
                value = value.replace(json.dumps(f"s{j}/{group}"), json.dumps(pinned_group(j, group, partitions)))
    return scenario_key(j, key, partitions, pinned), value


def run_batch(spark: Any, root: str, groups: list[tuple[Config, list[Runs]]]) -> tuple[Counter[str], list[str]]:
    """One versiq pipeline over every group (one Spark run per run index) and one JVM for Kafka,
    with one TopologyTestDriver per group fed scenario after scenario (each scenario's runs in
    sequence, records prefixed and shifted exactly as versiq's: stream time only grows from one
    scenario to the next, so every scenario is judged as if alone)."""
    kafka_input = []
    real = RealPipeline(spark, root)
    tally: Counter[str] = Counter()
    kept = []
    for config, scenarios in groups:
        compared = [runs for runs in scenarios if not kafka_forgets_a_tombstone(config, runs)]
        tally["set aside (Kafka forgets a replaced tombstone)"] += len(scenarios) - len(compared)
        if compared:
            kept.append((config, compared))
    groups = kept
    for g, (config, scenarios) in enumerate(groups):
        partitions = len(scenarios)
        inputs = [InputDef(f"i{i}", kind, history_retention_ms=r or 0,
                           partitions=1 if kind == "stream" else partitions)
                  for i, (kind, r) in enumerate(zip(config.kinds, config.retentions, strict=True))]
        steps = max(len(runs) for runs in scenarios)
        versiq_runs: list[dict[str, list[Rec]]] = [{} for _ in range(steps)]
        for j, runs in enumerate(scenarios):
            for step, run in enumerate(runs):
                for i, recs in run.items():
                    versiq_runs[step].setdefault(f"i{i}", []).extend(
                        Rec(*scenario_record(config, j, partitions, i, key, value), ts + j * SPAN,
                            j if config.kinds[i] != "stream" else 0)
                        for key, value, ts in recs)
        kafka_input.append({"id": f"g{g}", **config.kafka(), "records": [
            dict(zip(("key", "value"), scenario_record(config, j, partitions, i, key, v), strict=True),
                 input=i, ts=ts + j * SPAN)
            for j, runs in enumerate(scenarios) for i, (key, v, ts) in kafka_order(config, runs, partitions)]})
        real.add(f"g{g}_", inputs, config.tables(), versiq_runs)
    answers = {r["id"]: r for r in run_operator_scenarios(kafka_input)}
    real.run_all()
    differences: list[str] = []
    for g, (config, scenarios) in enumerate(groups):
        observed = real.observed(f"g{g}_", "out")
        first = real.observed(f"g{g}_", "agg") if config.op == "aggregate_twice" else None
        for j, runs in enumerate(scenarios):
            prefix = f"s{j}/"
            emissions, latest = _versiq_answer(observed, prefix, j * SPAN)
            kafka = _local_answer(answers[f"g{g}"], prefix, j * SPAN)
            if first is not None:  # aggregate_twice: the first aggregate's too (all in partition j)
                first_config = Config("aggregate", "", config.kinds, config.retentions, config.aggregator)
                first_kafka = _local_answer({"emitted": answers[f"g{g}"]["emittedFirst"],
                                             "latest": answers[f"g{g}"]["latestFirst"]}, prefix, j * SPAN)
                tally["emissions"] += len(first_kafka["emitted"])
                for problem in compare_scenario(first_config, first_kafka, *_versiq_answer(first, prefix, j * SPAN)):
                    differences.append(f"{config} g{g}s{j}: first aggregate: {problem}\n    runs {runs}")
            if config.op in ("aggregate", "aggregate_join", "aggregate_twice"):  # results are emitted in their
                # group's partition, partition by partition (aggregate_join's are all in partition j:
                # ``scenario_key``; aggregate_twice's second groups are not pinned)
                pin = config.op == "aggregate_join"

                def place(key: str, j: int = j, partitions: int = len(scenarios), pin: bool = pin) -> int:
                    return default_partition_of(scenario_key(j, key, partitions, pin), partitions, MURMUR2)

                emissions.sort(key=lambda e: place(e[0]))
                kafka["emitted"].sort(key=lambda e: place(e["key"]))
            tally[f"{config.op} scenarios"] += 1
            tally["records"] += sum(len(recs) for run in runs for recs in run.values())
            tally["emissions"] += len(kafka["emitted"])
            for problem in compare_scenario(config, kafka, emissions, latest):
                differences.append(f"{config} g{g}s{j}: {problem}\n    runs {runs}")
    tally["differences"] = len(differences)
    return tally, differences


def operator_batches(seed: int, per_op: int, ops: tuple[str, ...] = OPS) -> list[list[tuple[Config, list[Runs]]]]:
    """The scenarios of ``seed``: groups of GROUP_SIZE scenarios, ``per_op`` scenarios per operator,
    GROUPS_PER_BATCH groups per batch, all drawn from ``random.Random(seed)`` (the same seed, the
    same batches; ``VERSIQ_CONFORMANCE_BATCHES`` reruns some of them)."""
    rng = random.Random(seed)
    groups = []
    for op in OPS:
        if op not in ops:
            continue
        made = 0
        while made < per_op:
            size = min(GROUP_SIZE, per_op - made)
            config = random_config(rng, op)
            groups.append((config, [random_runs(rng, config) for _ in range(size)]))
            made += size
    rng.shuffle(groups)
    return [groups[i:i + GROUPS_PER_BATCH] for i in range(0, len(groups), GROUPS_PER_BATCH)]


#: The whole run's limit (tests.support.conformance): checked between batches; pytest-timeout's
#: (``backstop_s``) is the backstop for a batch that hangs.
TIME_LIMIT_S = time_limit_s(PER_OPERATOR * len(OPERATORS))


@pytest.mark.rule(13, 14, 15, 16, 17, 23, 24, 25, 26, 27, 28, 29, 30)
@pytest.mark.timeout(backstop_s(TIME_LIMIT_S))
def test_operators_agree_with_kafka_streams(spark: Any, tmp_path_factory: Any) -> None:
    """PER_OPERATOR scenarios per operator from one seed (``conformance_seed``: fixed in
    ``make test``, fresh in ``make conformance``), run once: every difference is reported once."""
    seed = conformance_seed()
    print(f"conformance (operators): seed {seed}, {PER_OPERATOR} scenarios per operator of {OPERATORS}",
          flush=True)
    limit = TimeLimit(TIME_LIMIT_S, "conformance (operators)")
    total: Counter[str] = Counter()
    differences: list[str] = []
    only = {int(n) for n in os.environ.get("VERSIQ_CONFORMANCE_BATCHES", "").split(",") if n.strip()}
    report = os.environ.get("VERSIQ_CONFORMANCE_REPORT")
    batches = operator_batches(seed, PER_OPERATOR, OPERATORS)
    chosen = [(n, batch) for n, batch in enumerate(batches) if not only or n in only]
    for done, (n, batch) in enumerate(chosen):
        limit.check(done, len(chosen), len(differences), seed)
        tally, found = run_batch(spark, str(tmp_path_factory.mktemp(f"operators{n}")), batch)
        total += tally
        differences += found
        if found and report:
            append_report(report, f"seed {seed} batch {n}", found)
        print(f"conformance (operators): seed {seed}, batch {n}: {dict(total)}", flush=True)
    assert not differences, f"{len(differences)} difference(s) with Kafka Streams {KAFKA_VERSION} " \
        f"(seed {seed}: {repeat_hint(seed)}):\n" + "\n".join(differences[:12])


def test_the_known_kafka_difference_is_recognised() -> None:
    """The one kind of difference 5,000 random scenarios found (seed 0, g4s312 of an outer join
    of versioned tables): left k1 = value@15, tombstone@15, value@2. Kafka forgets the tombstone
    and takes value@2 as the latest, so it joins it; versiq keeps the tombstone (rule 1), so
    value@2 is out of order and joins nothing (rule 15)."""
    config = Config("join", "outer", ("versioned", "versioned"), (1000, 1000))
    affected: Runs = [{1: [("k1", '{"n":1}', 37)]},
                      {0: [("k1", '{"n":2}', 15), ("k1", None, 15), ("k1", '{"n":3}', 2)]}]
    assert kafka_forgets_a_tombstone(config, affected)
    assert not kafka_forgets_a_tombstone(config, [{0: [("k1", '{"n":2}', 15), ("k1", None, 15), ("k1", "1", 20)]}])
    timestamped = Config("join", "outer", ("timestamped", "timestamped"), (1000, 1000))
    assert not kafka_forgets_a_tombstone(timestamped, affected)  # timestamped stores keep no versions


def test_kafka_forgetting_a_tombstone_in_its_result_store_is_recognised() -> None:
    """Found at 10,000 scenarios (seed 0, batch 3, g9s155): a filter over a timestamped table
    emits value@16, tombstone@16 (same timestamp) and value@7; Kafka's versioned result store
    then forgets the tombstone and answers value@7 as the latest, where versiq's table keeps the
    tombstone at 16 (rule 1). Only that key's final record is set aside; emissions are compared."""
    config = Config("filter", "", ("timestamped",), (1000,))
    kafka = {"emitted": [{"key": "k3", "value": '{"n":12}', "ts": 16}, {"key": "k3", "value": None, "ts": 16},
                         {"key": "k3", "value": '{"n":12}', "ts": 7}],
             "latest": {"k3": {"value": '{"n":12}', "ts": 7}}}
    emissions = [(e["key"], e["value"], e["ts"]) for e in kafka["emitted"]]
    assert compare_scenario(config, kafka, emissions, {"k3": (None, 16)}) == []
    assert compare_scenario(config, kafka, emissions[:1], {"k3": (None, 16)})  # emissions still compared


def test_an_aggregate_join_is_given_to_kafka_in_its_group_partitions_order() -> None:
    """Found by the first aggregate_join scenarios fed in the merge of the records: input 0's k2
    tombstone@36 (no value before it, so no group update) held input 1's x@9 back behind it,
    where versiq's group partition merges x@9 with k1@5's update only and takes the update first."""
    config = Config("aggregate_join", "inner", ("timestamped", "versioned"), (15, 0), "count")
    k2, k1, x = ("k2", None, 36), ("k1", '{"g":"@x"}', 5), ("x", '{"n":1}', 9)
    runs: Runs = [{0: [k2, k1], 1: [x]}]
    assert merge_order(config, runs) == [(1, x), (0, k2), (0, k1)]
    assert repartition_order(config, runs) == [(0, k2), (0, k1), (1, x)]
    assert kafka_order(config, runs, 1) == merge_order(config, runs)  # one partition: no repartition
    tie = [{0: [("k1", '{"g":"@x"}', 9)], 1: [x]}]
    assert repartition_order(config, tie) == [(1, x), (0, ("k1", '{"g":"@x"}', 9))]  # ties to the records


def test_an_aggregate_twice_regroups_by_the_scenarios_prefix_and_the_count() -> None:
    """aggregate_twice's first groups are pinned to the scenario's partition with a tail of six
    characters, which its second group key (``REGROUP``, in OperatorScenarios.java too) drops."""
    regroup = Expression(REGROUP)
    for j, partitions in ((0, 1), (3, 20), (19, 20), (7, 500)):
        for group in GROUPS:
            key = pinned_group(j, group, partitions)
            assert len(key) == len(f"s{j}/") + 6 and local_key(key, f"s{j}/") == group
            assert partitions == 1 or default_partition_of(key, partitions, MURMUR2) == j
            assert regroup.evaluate(key, {"count": 2, "sum": Decimal("1.5")}) == f"s{j}/c2"
            assert regroup.evaluate(key, {"sum": 3}) is None
    config = Config("aggregate_twice", "", ("versioned",), (0,), "count", "count_sum")
    assert scenario_record(config, 3, 20, 0, "k1", '{"g":"@x","n":1}') == \
        ("s3/k1", '{"g":' + json.dumps(pinned_group(3, "x", 20)) + ',"n":1}')
    assert _kafka_value(config, "2,1.5") == '{"count":2,"sum":1.5}'
