"""Property test: the Spark ingest equals the record-at-a-time reference model.

Random changelogs (out-of-order, duplicate timestamps, tombstones, late records, offsets with
duplicates) are split at random points into runs. To keep Spark runs few, each changelog lives
in its own stream-time partition of one store (partitions are independent stream-time domains
and keys are disjoint, so this is N separate stores in one), and run r ingests chunk r of every
changelog.
"""

from __future__ import annotations

import os
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.ingest import (
    StoredVersion,
    expressions,
    model_versions,
    record_line,
    rejected_rows,
    store_versions,
    stream_times,
    write_jsonl,
)
from tests.support.reference import InRecord, ReferenceStore
from versiq.ingest.pipeline import StoreSpec, run_ingest

VALUES = st.sampled_from(['1', '"a"', '{"x":1.50}', '[1,2]', '""', 'true', None])


@st.composite
def changelog(draw, index: int, with_offsets: bool):
    n = draw(st.integers(1, 14))
    keys = [f"e{index}-k{j}" for j in range(draw(st.integers(1, 3)))]
    records = []
    for _ in range(n):
        records.append((draw(st.sampled_from(keys)), draw(VALUES), draw(st.integers(0, 60))))
    offsets = None
    if with_offsets:
        offsets = [draw(st.integers(0, 2 * n)) for _ in range(n)]
    cuts = sorted(draw(st.lists(st.integers(0, n), max_size=2)))
    return records, offsets, cuts


@st.composite
def batch(draw):
    count = draw(st.integers(3, 8))
    logs = [draw(changelog(i, draw(st.booleans()))) for i in range(count)]
    retention = draw(st.sampled_from([0, 5, 20, 1000]))
    kind = draw(st.sampled_from(["versioned", "versioned", "timestamped"]))
    generated_code = draw(st.lists(st.booleans(), min_size=3, max_size=3))  # per run
    # after each run; a merge needs a bucket with files of three runs, so mostly after the last
    compactions = [draw(st.sampled_from(("none", *COMPACTIONS))) for _ in range(2)]
    compactions.append(draw(st.sampled_from(("merge", *COMPACTIONS[1:]))))
    buckets = draw(st.sampled_from([1, 1, 16]))  # one bucket: several runs' files to merge in it
    return logs, retention, kind, generated_code, compactions, buckets


#: What follows a run: nothing; continuous mode's compaction (``maintain.compact_if_due``'s
#: merge of recent files, or a bucket rewritten whole when they are large); the same forced to
#: merge wherever a merge is exact; ``versiq maintain`` (every bucket whole).
COMPACTIONS = ("none", "recent", "merge", "whole")


def _chunks(n: int, cuts: list[int]) -> list[tuple[int, int]]:
    """Three consecutive chunks [0, c1), [c1, c2), [c2, n); empty ones are skipped runs."""
    bounds = [0, *cuts, *([n] * (2 - len(cuts))), n]
    return [(bounds[i], bounds[i + 1]) for i in range(3)]


@pytest.mark.rule(1, 2, 3, 4, 5, 12, 19, 20, 21)
@settings(max_examples=5)
@given(batch())
def test_ingest_matches_reference_model(spark, tmp_path_factory, data):
    """Each run evaluates Spark's expressions either interpreted (small runs: every run here) or
    through generated code (larger runs), at random: both code paths must agree with the model.
    Runs 1 and 3 parse their files in this process when small and in Spark tasks when planned
    as larger runs (as a run beyond ``plan.PARSE_HERE_BYTES`` is), run 2 the other way (a small
    run parsed by Spark tasks: ``VERSIQ_PARSE_HERE_BYTES=0``; a larger one parsed here, as a run
    of up to ``PARSE_HERE_BYTES`` is). A run
    parsed here is decided here by DuckDB (``ingest.decisions_here``), one parsed by Spark tasks
    by Spark (``ingest.semantics``): the two engines decide runs of one store in turn. A run may
    be followed by a compaction (``COMPACTIONS``), which must not change what a query can return
    (rule 22: history that ended at or before the horizon may go)."""
    logs, retention, kind, generated_code, compactions, buckets = data
    root = tmp_path_factory.mktemp("prop")
    src, wh = str(root / "src"), str(root / "wh")
    os.makedirs(src)
    partitions = len(logs)
    model = ReferenceStore(kind=kind, history_retention_ms=retention, partitions=partitions)
    totals: Counter[str] = Counter()
    expected: Counter[str] = Counter()
    for r in range(3):
        run_records: list[InRecord] = []
        for i, (records, offsets, cuts) in enumerate(logs):
            lo, hi = _chunks(len(records), cuts)[r]
            if lo == hi:
                continue
            source = f"r{r}/e{i:03d}.jsonl"
            recs = [
                InRecord(source, pos, key, value, ts, i, None if offsets is None else offsets[j])
                for pos, (j, (key, value, ts)) in enumerate(
                    ((j, records[j]) for j in range(lo, hi)), start=1)
            ]
            write_jsonl(src, source, [record_line(x) for x in recs])
            run_records += recs
        parsed_here = generated_code[r] if r == 1 else not generated_code[r]
        with expressions(generated=generated_code[r], parsed_here=parsed_here):
            report = run_ingest(spark, wh, [StoreSpec("p", src, kind=kind, history_retention_ms=retention,
                                                      partitions=partitions, buckets=buckets)])
        entry = report.stores["p"]
        assert entry.error is None, entry.error
        counts = model.run(run_records)
        for name in ("read", "accepted_latest", "accepted_out_of_order", "replaced_same_timestamp",
                     "tombstones"):
            totals[name] += getattr(entry, name)
            expected[name] += getattr(counts, name)
        for reason, n in entry.rejected.items():
            totals["rejected." + reason] += n
            expected["rejected." + reason] += counts.rejected[reason]
        # the report's counts agree with the model run by run
        assert {k: v for k, v in totals.items() if v} == {k: v for k, v in expected.items() if v}
        _compact(spark, wh, compactions[r], kind, retention)

    path = os.path.join(wh, "p")
    keys = {f"e{i}-k{j}" for i in range(partitions) for j in range(3)}
    if kind == "versioned" and set(compactions) == {"none"}:
        assert store_versions(path) == model_versions(model, keys)
    elif kind == "versioned":
        horizons = {p: t - retention for p, t in model.stream_time.items()}
        assert _answerable(store_versions(path), horizons) == _answerable(model_versions(model, keys), horizons)
    else:
        from tests.support.ingest import timestamped_values

        assert timestamped_values(path) == {k: v for k, v in model.current.items()}
    assert stream_times(path) == model.stream_time
    got = Counter((row["reason"], row["source"], row["line"]) for row in rejected_rows(path))
    want = Counter((reason, rec.source, rec.pos) for reason, rec in model.rejected)
    assert got == want


def _answerable(versions: dict[str, list[StoredVersion]], horizons: dict[int, int]) -> dict[str, list[StoredVersion]]:
    """The versions a query can return: not those that ended at or before their partition's
    horizon (the keys of changelog ``i``, ``e<i>-k<j>``, live in partition ``i``)."""
    out = {}
    for key, vs in versions.items():
        horizon = horizons.get(int(key[1:].split("-")[0]))
        kept = [v for v in vs if v.valid_to is None or horizon is None or v.valid_to > horizon]
        if kept:
            out[key] = kept
    return out


def _compact(spark, warehouse: str, how: str, kind: str, retention: int) -> None:  # type: ignore[no-untyped-def]
    """Compact store ``p`` as ``how`` says (``COMPACTIONS``); what a query can return is the same after."""
    from tests.support.ingest import timestamped_values
    from versiq.ingest import maintain

    path = os.path.join(warehouse, "p")
    if how == "none" or not os.path.isdir(os.path.join(path, "_delta_log")):
        return
    horizons = {p: t - retention for p, t in stream_times(path).items()}
    before = store_versions(path) if kind == "versioned" else timestamped_values(path)
    maintain.maintain_store(warehouse, "p", spark=lambda: spark, recent_only=how != "whole",
                            rewrite_share=1e9 if how == "merge" else maintain.REWRITE_SHARE)
    if kind == "versioned":
        assert _answerable(store_versions(path), horizons) == _answerable(before, horizons)
    else:
        assert timestamped_values(path) == before
