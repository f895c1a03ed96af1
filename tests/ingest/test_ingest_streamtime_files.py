"""Property test: stream time across several files of one stream-time partition (no offsets,
so processing order is (source, pos) and the running maximum is computed per file plus over
the earlier files) equals the record-at-a-time reference model, across runs. Both ways of
computing it: from the parser's per-file maxima, and (``FILE_STATS_LIMIT`` 0, as for runs with
too many files x partitions) with Spark windows."""

from __future__ import annotations

import os
from collections import Counter
from unittest import mock

from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.support.ingest import model_versions, record_line, rejected_rows, store_versions, stream_times, write_jsonl
from tests.support.reference import InRecord, ReferenceStore
from versiq.ingest import pipeline
from versiq.ingest.pipeline import StoreSpec, run_ingest

RECORD = st.tuples(st.sampled_from(["a", "b", "c", "d", "e"]), st.sampled_from(['1', '"x"', None]),
                   st.integers(0, 80))
RUN = st.lists(st.lists(RECORD, min_size=0, max_size=8), min_size=1, max_size=4)  # files of one run


@settings(max_examples=10, deadline=None)
# f8 sorts before f9: its timestamp 80 makes f9's 5 late, and within f9 the 60 makes the 40 late
@example(runs=[[[("b", "1", 5), ("c", "1", 60), ("d", "1", 40)], [("a", "1", 80)]]], partitions=1, retention=10,
         kind="versioned", file_stats_limit=100_000)
@example(runs=[[[("b", "1", 5), ("c", "1", 60), ("d", "1", 40)], [("a", "1", 80)]]], partitions=2, retention=10,
         kind="versioned", file_stats_limit=0)
@given(st.lists(RUN, min_size=1, max_size=2), st.sampled_from([1, 2]), st.sampled_from([0, 10, 1000]),
       st.sampled_from(["versioned", "timestamped"]), st.sampled_from([100_000, 0]))
def test_stream_time_over_many_files_matches_reference_model(spark, tmp_path_factory, runs, partitions,
                                                             retention, kind, file_stats_limit):
    with mock.patch.object(pipeline, "FILE_STATS_LIMIT", file_stats_limit):
        _check(spark, tmp_path_factory, runs, partitions, retention, kind)


def _check(spark, tmp_path_factory, runs, partitions, retention, kind):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("stf")
    src, wh = str(root / "src"), str(root / "wh")
    os.makedirs(src)
    model = ReferenceStore(kind=kind, history_retention_ms=retention, partitions=partitions)
    for r, files in enumerate(runs):
        run_records: list[InRecord] = []
        for f, records in enumerate(files):
            if not records:
                continue
            # file names sort in the opposite order of their creation, and across runs
            source = f"r{r}/f{9 - f}.jsonl"
            recs = [InRecord(source, pos, key, value, ts) for pos, (key, value, ts) in enumerate(records, start=1)]
            write_jsonl(src, source, [record_line(x) for x in recs])
            run_records += recs
        if not run_records:
            continue
        report = run_ingest(spark, wh, [StoreSpec("s", src, kind=kind, history_retention_ms=retention,
                                                  partitions=partitions)])
        entry = report.stores["s"]
        assert entry.error is None, entry.error
        counts = model.run(run_records)
        assert (entry.read, entry.accepted_latest, entry.accepted_out_of_order, entry.replaced_same_timestamp,
                entry.tombstones) == (counts.read, counts.accepted_latest, counts.accepted_out_of_order,
                                      counts.replaced_same_timestamp, counts.tombstones)
        assert {k: v for k, v in entry.rejected.items() if v} == {k: v for k, v in counts.rejected.items() if v}
    path = os.path.join(wh, "s")
    if not os.path.exists(path):
        return
    if kind == "versioned":
        assert store_versions(path) == model_versions(model, {"a", "b", "c", "d", "e"})
    assert stream_times(path) == model.stream_time
    got = Counter((row["reason"], row["source"], row["line"]) for row in rejected_rows(path))
    want = Counter((reason, rec.source, rec.pos) for reason, rec in model.rejected)
    assert got == want
