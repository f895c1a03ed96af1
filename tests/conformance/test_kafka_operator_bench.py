"""The Kafka Streams side of bench/derived_vs_kafka_streams.py measures working topologies.

OperatorBench.java (conformance/kafka) drives one operator's topology (the differential test's,
OperatorScenarios.topology) with bench/derived_bench.py's generated files, merged as versiq
merges its inputs. Here it runs on a few hundred of those records, and what it reports must be
what versiq's reference model (tests/support/derived_reference.py) does with the same files: the
records read, the output count (the bench's figure), and the outputs themselves, in order (key,
value, timestamp floored per key as the differential test does, docs/semantics.md rule 26). A
topology set up wrong (an expression, a join type, a store kind), files read or merged in
another order, or outputs not counted would fail it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.derived_reference import InputDef, Rec, run_pipeline
from tests.support.kafka_streams import run_operator_bench

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import derived_bench as db  # noqa: E402
import derived_vs_kafka_streams as dv  # noqa: E402


def _records(files: list[str]) -> list[Rec]:
    out = []
    for file in files:
        with open(file) as handle:
            for line in handle:
                d = json.loads(line)
                value = None if d["value"] is None else json.dumps(d["value"], separators=(",", ":"))
                out.append(Rec(d["key"], value, d["timestamp"]))
    return out


Emitted = list[tuple[str, str | None, int]]


def reference_emitted(op: str, files: dict[str, list[str]]) -> tuple[int, Emitted]:
    """Records in and the emissions of versiq's reference model for the bench's table ``op`` over
    ``files`` (one run; inputs declared stores first, as the bench's pipeline does)."""
    entry, inputs = db.OPERATORS[op]
    defs = sorted((InputDef(n, db.KINDS[n], history_retention_ms=db.GRACE_MS if db.KINDS[n] != "stream" else 0)
                   for n in inputs), key=lambda d: d.kind == "stream")
    table: dict[str, Any] = dict(entry)
    if op != "stream_join":
        table["history_retention_ms"] = db.GRACE_MS  # derived_bench.operator_pipeline: "7d"
    run = {n: _records(files[n]) for n in inputs}
    result = run_pipeline(defs, [table], [run])[entry["name"]]
    return sum(len(r) for r in run.values()), [(e.key, e.value, e.timestamp) for e in result.emissions]


def floored(outputs: Emitted) -> Emitted:
    """Kafka's outputs with timestamps floored per key, as versiq's results are (rule 26)."""
    newest: dict[str, int] = {}
    out = []
    for key, value, ts in outputs:
        newest[key] = max(ts, newest.get(key, ts))
        out.append((key, value, newest[key]))
    return out


@pytest.mark.parametrize("op", ["fk_join", "aggregate", "stream_join"])
def test_operator_bench_outputs_what_versiq_emits(op: str, tmp_path: Path) -> None:
    """fk_join (subscription and response topics), aggregate (repartition, count and sum) and
    stream_join (two inputs interleaved by the merge: the prices a click meets depend on its order)."""
    sizes = db.Sizes(400, 30)  # 400 orders over 80 keys, 20 customers, 30 regions
    counts = db.write_sources(str(tmp_path), sizes, db.build_counts(sizes), 0)
    files = {name: dv.source_files(str(tmp_path), name) for name in counts}
    records_in, emitted = reference_emitted(op, files)
    output_file = tmp_path / "outputs.jsonl"
    kafka = run_operator_bench({**dv.kafka_scenario(op, files, warm_up=50), "outputFile": str(output_file)},
                               timeout=120)
    assert kafka["records_in"] == records_in
    assert kafka["warm_up"]["records"] == 50
    assert kafka["output_count"] == len(emitted) > records_in // 2
    assert kafka["records_per_s"] > 0 and "TopologyTestDriver" in kafka["driver"]
    outputs = [(o["key"], o["value"], o["ts"]) for o in map(json.loads, output_file.read_text().splitlines())]
    assert floored(outputs) == emitted
