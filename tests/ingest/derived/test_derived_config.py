"""The ``streams:``/``tables:`` sections of a pipeline file: everything is checked at load,
before any data is touched (docs/semantics.md rule 18 included), with a message naming the entry."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from versiq.ingest.config import load_config
from versiq.ingest.errors import UsageError

HEAD = """
stores:
  - {name: orders, source: src}
  - {name: customers, source: src, kind: timestamped}
streams:
  - {name: clicks, source: src}
"""


def _load(tmp_path: Path, tables: str, head: str = HEAD) -> object:
    (tmp_path / "src").mkdir(exist_ok=True)
    path = tmp_path / "pipeline.yaml"
    path.write_text(head + tables)
    return load_config(str(path))


def test_a_full_pipeline_loads(tmp_path: Path) -> None:
    pipeline = _load(tmp_path, """
tables:
  - {name: big, from: orders, filter: "value.amount > 100 and not (value.region is null)"}
  - {name: copy, from: big, kind: timestamped, history_retention: 2h}
  - {name: oc, fk_join: {left: orders, right: customers, foreign_key: "value.customer_id", type: left}}
  - {name: ab, join: {left: orders, right: customers, type: outer}, select: {a: "value.left.amount"}}
  - {name: rev, from: orders, group_by: "lower(value.region)", aggregate: {count: true, sum: "value.amount"}}
  - {name: priced, stream_join: {stream: clicks, table: orders, type: inner}}
  - {name: last_priced, from: priced, filter: "value.right is not null"}
""")
    assert pipeline.inputs == ["orders", "customers", "clicks"]  # type: ignore[attr-defined]
    tables = {t.name: t for t in pipeline.tables}  # type: ignore[attr-defined]
    assert [t.op for t in tables.values()] == ["filter", "copy", "fk_join", "join", "aggregate", "stream_join",
                                               "to_table"]
    assert tables["priced"].kind == "stream" and tables["copy"].history_retention_ms == 7_200_000
    assert tables["rev"].aggregates[0] == ("count", None)
    stores = {s.name: s for s in pipeline.stores}  # type: ignore[attr-defined]
    assert stores["orders"].changelog and stores["customers"].changelog


@pytest.mark.parametrize(("tables", "message"), [
    ("- {name: s, from: orders, suppress: {until: window}}", "suppress cannot be applied to a versioned table"),
    ("- {name: s, from: customers, suppress: {until: window}}", "suppress is not supported"),
    ("- {name: g, from: orders, global: true}", "a global table cannot be versioned"),
    ("- {name: x, from: nowhere}", "'from' names 'nowhere', which is not a store, stream or table declared earlier"),
    ("- {name: x, from: y}\n  - {name: y, from: orders}", "'from' names 'y'"),
    ("- {name: x, from: orders, filter: 'value.a >'}", "tables[0] (x): 'filter': "),
    ("- {name: x, stream_join: {stream: orders, table: customers}}", "'stream' must be a stream"),
    ("- {name: x, join: {left: clicks, right: orders}}", "'left' must be a table, but 'clicks' is a stream"),
    ("- {name: x, from: clicks, group_by: key, aggregate: {count: true}}", "'from' must be a table"),
    ("- {name: x, join: {left: orders, right: customers, type: full}}", "'join.type' must be one of"),
    ("- {name: x, from: orders, group_by: key, aggregate: {max: value}}", "unknown aggregate(s): max"),
    ("- {name: x, from: orders, group_by: key, aggregate: {count: true}, reduce: {add: agg, subtract: agg}}",
     "exactly one of 'aggregate' and 'reduce'"),
    ("- {name: x, from: orders, group_by: key}", "exactly one of 'aggregate' and 'reduce'"),
    ("- {name: x, from: orders, group_by: key, aggregate: {init: '0', add: agg}}",
     "'aggregate' must be a mapping with exactly init, add, subtract"),
    ("- {name: x, from: orders, group_by: key, aggregate: {count: true, init: '0', add: agg, subtract: agg}}",
     "got add, count, init, subtract"),
    ("- {name: x, from: orders, group_by: key, reduce: {init: '0', add: agg, subtract: agg}}",
     "'reduce' must be a mapping with exactly add, subtract"),
    ("- {name: x, from: orders, group_by: key, aggregate: {init: agg, add: agg, subtract: agg}}",
     "'aggregate.init' reads 'agg'"),
    ("- {name: x, from: orders, filter: 'agg > 1'}", "'filter' reads 'agg'"),
    ("- {name: x, from: orders, group_by: agg, aggregate: {count: true}}", "'group_by' reads 'agg'"),
    ("- {name: orders, from: customers}", "already used"),
    ("- {name: x, from: orders, join: {left: orders, right: customers}}", "exactly one operation"),
    ("- {name: x, from: orders, colour: red}", "unknown field(s) for a copy table: colour"),
    ("- {name: x, stream_join: {stream: clicks, table: orders}, kind: versioned}", "output is a stream"),
])
@pytest.mark.rule(18)
def test_refused_at_load(tmp_path: Path, tables: str, message: str) -> None:
    with pytest.raises(UsageError) as info:
        _load(tmp_path, "tables:\n  " + tables + "\n")
    assert message in str(info.value)


@pytest.mark.rule(17)
def test_custom_aggregate_and_reduce_load(tmp_path: Path) -> None:
    """Issue 13 item 5: Kafka's aggregate(initializer, adder, subtractor) and reduce(adder, subtractor)."""
    pipeline = _load(tmp_path, """tables:
  - {name: trail, from: orders, group_by: value.region,
     aggregate: {init: "''", add: "concat(agg, value.id)", subtract: "substring(agg, 1, length(agg) - 1)"}}
  - {name: total, from: orders, group_by: "int(value.amount) % 10",
     reduce: {add: "agg + value", subtract: "agg - value"}}
""")
    tables = {t.name: t for t in pipeline.tables}  # type: ignore[attr-defined]
    trail, total = tables["trail"], tables["total"]
    assert trail.op == total.op == "aggregate" and not trail.aggregates and not total.aggregates
    assert trail.aggregator is not None and trail.aggregator.init is not None
    assert trail.aggregator.add.text == "concat(agg, value.id)"
    assert total.aggregator is not None and total.aggregator.init is None  # reduce


@pytest.mark.rule(18)
def test_a_versioned_global_store_is_refused(tmp_path: Path) -> None:
    head = "stores:\n  - {name: orders, source: src, global: true}\n"
    with pytest.raises(UsageError, match="a global table cannot be versioned"):
        _load(tmp_path, "", head)
    _load(tmp_path, "", "stores:\n  - {name: orders, source: src, global: true, kind: timestamped}\n")


def test_cli_refuses_a_bad_pipeline_before_touching_data(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    path = tmp_path / "pipeline.yaml"
    path.write_text(HEAD + "tables:\n  - {name: s, from: orders, suppress: {}}\n")
    warehouse = tmp_path / "wh"
    result = subprocess.run([sys.executable, "-m", "versiq.cli", "ingest", "--warehouse", str(warehouse),
                             "--config", str(path)], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert result.returncode == 2, result.stderr
    assert "suppress cannot be applied to a versioned table" in result.stderr
    assert not warehouse.exists()
