"""``ingest.order``: the run columns made while parsing (``seq``, the in-file stream time
``fst``, ``raw`` kept only for parser rejections) against a plain record-at-a-time
computation, over batches of any size (the running maximum carries across batches)."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from versiq.ingest.order import POS_BITS, RUN_SCHEMA, split_seq, with_order
from versiq.ingest.records import PARSED_SCHEMA
from versiq.ingest.semantics import files_before
from versiq.layout import PARTITIONERS, Partitioning, default_partition_of

ROW = st.tuples(st.sampled_from(["a", "b", "c", "é", "k1", "k2"]), st.integers(-5, 50), st.booleans())


def _batches(rows: list[tuple[str, int, bool]], size: int) -> list[pa.RecordBatch]:
    """Parser-shaped batches of one file: (key, ts, rejected) rows at lines 1, 2, ..."""
    out = []
    for start in range(0, len(rows), size):
        chunk = rows[start:start + size]
        out.append(pa.RecordBatch.from_pydict({
            "source": ["f.jsonl"] * len(chunk),
            "pos": [start + i + 1 for i in range(len(chunk))],
            "key": [None if bad else key for key, _, bad in chunk],
            "value": ["1"] * len(chunk),
            "ts": [None if bad else ts for _, ts, bad in chunk],
            "part": [None] * len(chunk),
            "offset": [None] * len(chunk),
            "reason": ["malformed" if bad else None for _, _, bad in chunk],
            "detail": ["x" if bad else None for _, _, bad in chunk],
            "raw": [f"line {start + i + 1}" for i in range(len(chunk))],
        }, schema=PARSED_SCHEMA))
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(ROW, max_size=40), st.integers(1, 7), st.sampled_from([1, 2, 3, 7]), st.integers(0, 5),
       st.sampled_from(PARTITIONERS))
def test_run_columns_match_a_record_at_a_time_computation(rows, size, partitions, file_index, partitioner):
    partitioning = Partitioning(partitions, partitioner)
    out = pa.Table.from_batches(list(with_order(iter(_batches(rows, size)), file_index, partitioning)),
                                schema=RUN_SCHEMA).to_pylist()
    assert len(out) == len(rows)
    running: dict[int, int] = {}
    for line, ((key, ts, bad), got) in enumerate(zip(rows, out, strict=True), start=1):
        assert got["seq"] == (file_index << POS_BITS) + line
        assert split_seq(got["seq"]) == (file_index, line)
        if bad:
            assert got["fst"] is None and got["raw"] == f"line {line}"
            continue
        assert got["raw"] is None  # the text of records the parser took is read again if needed
        p = default_partition_of(key, partitions, partitioner)
        assert got["fst"] == running.get(p)
        running[p] = max(running.get(p, ts), ts)


def test_streams_get_no_stream_time():
    [batch] = list(with_order(iter(_batches([("a", 3, False), ("a", 1, False)], 10)), 0, None))
    assert batch.column("fst").to_pylist() == [None, None]


def test_files_before_combines_earlier_files_per_partition():
    file_max = {(0, 2): 50, (0, 0): 10, (1, 1): 7, (0, 1): 5, (1, 3): 1}
    assert files_before(file_max) == [(0, 1, 10), (0, 2, 10), (1, 3, 7)]
