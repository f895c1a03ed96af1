"""``ingest.delta.StateAhead``: Delta's snapshot state computed between continuous-mode runs is
an optimisation only; it never fails a run and never changes what the next run commits."""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from tests.support.ingest import write_jsonl
from versiq import layout
from versiq.ingest.delta import StateAhead
from versiq.ingest.pipeline import StoreSpec, run_ingest
from versiq.layout import read_state


def _record(key: str, ts: int) -> str:
    return json.dumps({"key": key, "value": {"n": ts}, "timestamp": ts})


def test_state_ahead_of_a_store_then_the_next_run_commits_and_a_broken_table_is_only_logged(
        spark: Any, tmp_path: Any, caplog: Any) -> None:
    source, warehouse = str(tmp_path / "src"), str(tmp_path / "wh")
    write_jsonl(source, "a.jsonl", [_record("k1", 1000), _record("k2", 2000)])
    spec = StoreSpec(name="s", source=source)
    first = run_ingest(spark, warehouse, [spec]).stores["s"]
    path = layout.table_path(warehouse, "s")
    broken = str(tmp_path / "broken")
    os.makedirs(os.path.join(broken, "_delta_log"))
    with open(os.path.join(broken, "_delta_log", "00000000000000000000.json"), "w") as handle:
        handle.write("not a Delta log entry\n")
    ahead = StateAhead(spark)
    with caplog.at_level(logging.WARNING, logger="versiq.ingest"):
        ahead.start([path, broken, str(tmp_path / "no-table")])
        ahead.wait()
    warned = [r.getMessage() for r in caplog.records if "ahead of its next commit" in r.getMessage()]
    assert warned == [f"computing the Delta state of {broken} ahead of its next commit failed"], warned
    # a run started while a computation is under way commits as usual (where its commit checks a
    # transaction id, that check waits for the computation)
    write_jsonl(source, "b.jsonl", [_record("k1", 3000)])
    ahead.start([path])
    second = run_ingest(spark, warehouse, [spec]).stores["s"]
    ahead.wait()
    assert first.snapshot is not None and second.snapshot == first.snapshot + 1
    assert second.accepted_latest == 1 and read_state(path, second.snapshot).run == 2
