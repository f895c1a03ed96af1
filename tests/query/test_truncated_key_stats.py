"""Delta's string statistics are prefixes (issue 12): a file's maximum key may be cut to 32
characters plus a tie-breaking character that sorts *before* some continuations (delta-spark
writes U+007F). Readers prune files with ``layout.may_hold_key``, which must never rule out a
file that holds the key."""

from __future__ import annotations

import json
import os

from hypothesis import given
from hypothesis import strategies as st

from tests.support.ingest import write_jsonl
from versiq.ingest.pipeline import StoreSpec, run_ingest
from versiq.layout import may_hold_key
from versiq.query.api import VersionedKeyQuery
from versiq.query.engine import Engine

PREFIX = "p" * 32


def _truncated_max(keys: list[str]) -> str:
    """Delta's statistic for the largest of ``keys`` (prefix + tie-breaker when longer)."""
    top = max(keys)
    return top if len(top) <= 32 else top[:32] + "\x7f"


@given(st.lists(st.text(alphabet=st.sampled_from("p\x7f\x80é😀a"), min_size=30, max_size=36), min_size=1, max_size=5))
def test_a_truncated_maximum_never_rules_out_a_key_the_file_holds(keys):
    lo, hi = min(keys)[:32], _truncated_max(keys)
    for key in keys:
        assert may_hold_key(key, lo, hi)


def test_exact_statistics_still_prune():
    assert not may_hold_key("b", "c", "d") and not may_hold_key("e", "c", "d") and may_hold_key("c", "c", "d")


def test_keys_past_a_truncated_maximum_are_found_through_the_service_engine(spark, tmp_path):
    """One bucket, one file: its maximum key continues past 32 characters with characters that
    sort after the tie-breaker; every key is still answered from the index and from DuckDB."""
    keys = [PREFIX + "é", PREFIX + "😀", PREFIX + "\x7f\x7f", PREFIX + "a", "short"]
    src = tmp_path / "src"
    write_jsonl(str(src), "a.jsonl", [json.dumps({"key": k, "value": i, "timestamp": i + 1})
                                      for i, k in enumerate(keys)])
    wh = str(tmp_path / "wh")
    assert run_ingest(spark, wh, [StoreSpec("s", str(src), buckets=1)]).stores["s"].error is None
    engine = Engine(wh, refresh_interval_s=3600)
    try:
        engine.refresh()
        for snapshot in (None, 0):  # the in-memory index, then DuckDB over snapshot 0
            for i, key in enumerate(keys):
                result = engine.get("s", VersionedKeyQuery(key), snapshot=snapshot)
                assert result.outcome == "ok" and result.record is not None and result.record.value == str(i), key
    finally:
        engine.close()
    assert os.path.isdir(os.path.join(wh, "s", "bucket=0"))
