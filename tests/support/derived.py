"""Run pipelines of the ``tests.support.derived_reference`` shape through the real system.

``RealPipeline`` writes each run's records as one JSONL file per input, runs the real
``run_pipeline`` (Spark ingest of stores and streams, then the derived phase) and reads back
what landed in Delta: derived store versions, ``_emitted`` rows, stream outputs, report counts.
Several independent pipelines can share one set of Spark runs (``combine``): their names get
a prefix and their runs are aligned by index; the input merge restricted to one pipeline's
inputs is the same as merging them alone, so results do not depend on the company.
No tests here.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from dataclasses import dataclass, field
from typing import Any

import duckdb
from deltalake import DeltaTable

from tests.support.derived_reference import InputDef, Rec
from tests.support.ingest import store_versions, timestamped_values
from versiq.ingest.config import Pipeline
from versiq.ingest.derived.spec import parse_tables
from versiq.ingest.pipeline import StoreSpec
from versiq.ingest.run import run_pipeline
from versiq.ingest.streams import StreamSpec

REFS = {"from": None, "join": ("left", "right"), "fk_join": ("left", "right"), "stream_join": ("stream", "table")}


def rename_table(table: dict[str, Any], prefix: str, inputs_as: dict[str, str] | None = None) -> dict[str, Any]:
    """A ``tables`` entry with every table/input name prefixed (expressions untouched), or for the
    names in ``inputs_as`` the full name given there, and ``history_retention_ms`` (the reference
    model's field) as the YAML's ``history_retention``."""
    renamed = inputs_as or {}

    def ref(name: str) -> str:
        return renamed.get(name, prefix + name)

    out = dict(table)
    out["name"] = prefix + table["name"]
    if "from" in table:
        out["from"] = ref(table["from"])
    for op in ("join", "fk_join", "stream_join"):
        if op in table:
            sub = dict(table[op])
            refs = REFS[op]
            assert refs is not None
            for side in refs:
                sub[side] = ref(sub[side])
            out[op] = sub
    if "history_retention_ms" in out:
        out["history_retention"] = out.pop("history_retention_ms")
    return out


def record_line(rec: Rec, partitions: int) -> str:
    value = "null" if rec.value is None else rec.value
    extra = f',"partition":{rec.partition}' if partitions > 1 else ""
    return f'{{"key":{json.dumps(rec.key)},"value":{value},"timestamp":{rec.timestamp}{extra}}}'


@dataclass
class Observed:
    """What the real system produced for one derived table (cumulative over runs)."""

    emissions: list[tuple[str, str | None, int, str]] = field(default_factory=list)  # key, value, ts, cause
    versions: dict[str, list[tuple[int, int | None, str | None]]] = field(default_factory=dict)
    records: list[tuple[str, str | None, int]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("emitted", "accepted_latest", "accepted_out_of_order", "tombstones", "late"), 0))


class RealPipeline:
    """Several reference-shaped pipelines (one per prefix), run together through the real ingest.
    A pipeline's tables may read inputs added under another prefix (``add``'s ``inputs_as``):
    several pipelines over one set of input stores, each a topology of its own (tables that
    share only source inputs are independent: ``derive._components``)."""

    def __init__(self, spark: Any, root: str) -> None:
        self.spark = spark
        self.root = root
        self.warehouse = os.path.join(root, "warehouse")
        self.inputs: list[tuple[str, InputDef]] = []
        self.tables: list[tuple[str, dict[str, Any]]] = []
        self.runs: list[tuple[str, list[dict[str, list[Rec]]]]] = []
        self.reports: list[Any] = []
        self.inputs_as: dict[str, dict[str, str]] = {}

    def add(self, prefix: str, inputs: list[InputDef], tables: list[dict[str, Any]],
            runs: list[dict[str, list[Rec]]], inputs_as: dict[str, str] | None = None) -> None:
        """A pipeline named by ``prefix``; ``inputs_as``: the inputs its tables read that are
        another pipeline's (input name -> full name), not in ``inputs``."""
        self.inputs += [(prefix, i) for i in inputs]
        self.tables += [(prefix, t) for t in tables]
        self.runs.append((prefix, runs))
        if inputs_as:
            self.inputs_as[prefix] = dict(inputs_as)

    def pipeline(self) -> Pipeline:
        stores, streams, kinds = [], [], {}
        for prefix, spec in self.inputs:
            name = prefix + spec.name
            source = os.path.join(self.root, "sources", name)
            os.makedirs(source, exist_ok=True)
            if spec.kind == "stream":
                streams.append(StreamSpec(name=name, source=source))
                kinds[name] = "stream"
            else:
                stores.append(StoreSpec(name=name, source=source, kind=spec.kind,
                                        history_retention_ms=spec.history_retention_ms,
                                        partitions=spec.partitions, changelog=True))
                kinds[name] = spec.kind
        tables = parse_tables([rename_table(t, prefix, self.inputs_as.get(prefix)) for prefix, t in self.tables],
                              kinds)
        return Pipeline(stores=stores, streams=streams, tables=tables)

    def copy_to(self, root: str) -> RealPipeline:
        """A copy of this pipeline and of everything its runs left (sources, warehouse, reports)
        under ``root``, to go on from: a store remembers the files it read by their names in the
        source folder, so the copy's next run reads only the files written after the copy."""
        shutil.copytree(self.root, root, dirs_exist_ok=True)
        other = RealPipeline(self.spark, root)
        other.inputs, other.tables, other.runs = list(self.inputs), list(self.tables), list(self.runs)
        other.reports, other.inputs_as = list(self.reports), copy.deepcopy(self.inputs_as)
        return other

    def steps(self) -> int:
        return max(len(runs) for _, runs in self.runs)

    def write_step(self, step: int) -> None:
        """Write run ``step``'s records of every pipeline as one new JSONL file per input."""
        partitions = {prefix + i.name: i.partitions for prefix, i in self.inputs}
        for prefix, runs in self.runs:
            if step >= len(runs):
                continue
            for name, recs in runs[step].items():
                if not recs:
                    continue
                full = prefix + name
                path = os.path.join(self.root, "sources", full, f"run-{step:04d}.jsonl")
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w", encoding="utf-8") as handle:
                    handle.writelines(record_line(r, partitions[full]) + "\n" for r in recs)

    def run_once(self, pipeline: Pipeline | None = None) -> Any:
        report = run_pipeline(self.spark, self.warehouse, pipeline or self.pipeline())
        self.reports.append(report)
        return report

    def run_all(self) -> None:
        pipeline = self.pipeline()
        for step in range(self.steps()):
            self.write_step(step)
            report = self.run_once(pipeline)
            assert not report.failed, report.to_json()

    def observed(self, prefix: str, table: str) -> Observed:
        name = prefix + table
        path = os.path.join(self.warehouse, name)
        out = Observed()
        for report in self.reports:
            entry = report.tables.get(name)
            if entry is None or entry.run is None:
                continue
            out.counts["emitted"] += entry.emitted
            out.counts["accepted_latest"] += entry.accepted_latest
            out.counts["accepted_out_of_order"] += entry.accepted_out_of_order
            out.counts["tombstones"] += entry.tombstones
            out.counts["late"] += entry.rejected["late"]
        emitted = os.path.join(path, "_emitted")
        if os.path.isdir(os.path.join(emitted, "_delta_log")):
            rows = DeltaTable(emitted).to_pyarrow_table().sort_by([("run", "ascending"), ("sequence", "ascending")])
            shared = {full: short for short, full in self.inputs_as.get(prefix, {}).items()}
            out.emissions = [(r["key"], r["value"], r["timestamp"],
                              shared.get(r["cause"], r["cause"].removeprefix(prefix))) for r in rows.to_pylist()]
        kind = next(t for p, t in self.tables if p + t["name"] == name).get("kind", "versioned")
        is_stream = "stream_join" in next(t for p, t in self.tables if p + t["name"] == name)
        if is_stream:
            files = DeltaTable(path).file_uris()
            if files:
                out.records = [tuple(r) for r in duckdb.sql(  # type: ignore[misc]
                    "SELECT key, value, timestamp FROM read_parquet($f) ORDER BY run, seq",
                    params={"f": files}).fetchall()]
        elif kind == "timestamped":
            out.versions = {k: [(t, None, v)] for k, (v, t) in timestamped_values(path).items() if v is not None}
        else:
            out.versions = {k: [(v.timestamp, v.valid_to, v.value) for v in vs]
                            for k, vs in store_versions(path).items()}
        return out
