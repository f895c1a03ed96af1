"""DuckDB reading ``s3://`` Parquet through ``versiq.storage`` (pyarrow's S3 file system wrapped for
fsspec), against a real S3 server (SeaweedFS, the ``s3_server`` fixture).

DuckDB shares one file handle between its threads and seeks then reads; a handle with a single
position let one thread's read land at another's offset, which decoded garbage ("don't know what
type", ZSTD errors) on files of many row groups: the 10M-version store's files made a served S3
warehouse never ready (bench/s3_bench.py). Every scan here must equal the local read."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from versiq import storage

BUCKET = "versiq-reads"


@pytest.fixture
def s3(s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    return s3_server.serve_bucket(BUCKET, monkeypatch)


def test_multithreaded_scans_of_a_file_of_many_row_groups_read_the_right_bytes(s3: Any, tmp_path: Any) -> None:
    rng = np.random.default_rng(1)
    n = 400_000
    table = pa.table({"key": [f"k{i:07d}" for i in range(n)],
                      "value": [("x" * int(w)) + str(i) for i, w in enumerate(rng.integers(0, 40, n))],
                      "v": rng.integers(0, 1 << 40, n)})
    local = str(tmp_path / "a.parquet")
    pq.write_table(table, local, row_group_size=8000, compression="zstd")  # 50 row groups
    with open(local, "rb") as handle, s3.filesystem().open_output_stream(f"{BUCKET}/t/a.parquet") as out:
        out.write(handle.read())
    query = "SELECT count(*), sum(hash(value)), sum(v), min(key), max(key) FROM read_parquet($files)"
    want = storage.duckdb_connect().sql(query, params={"files": [local]}).fetchall()
    for _ in range(8):
        con = storage.duckdb_connect(f"s3://{BUCKET}", config={"threads": 4})
        try:
            assert con.sql(query, params={"files": [f"s3://{BUCKET}/t/a.parquet"]}).fetchall() == want
            # a point read (row-group pruning: ranged GETs) as the older-snapshot path does
            row = con.sql("SELECT value FROM read_parquet($files) WHERE key = 'k0312345'",
                          params={"files": [f"s3a://{BUCKET}/t/a.parquet"]}).fetchall()
            assert row == [(table.column("value")[312345].as_py(),)]
        finally:
            con.close()
    assert os.path.getsize(local) > 5_000_000


def test_locations_are_parsed_once_for_every_reader() -> None:
    assert storage.normalize("s3a://b/p/") == "s3://b/p"
    assert storage.join("s3://b/p", "store", "_delta_log") == "s3://b/p/store/_delta_log"
    assert storage.data_file("s3://b/p/s", "bucket=1/part%201.parquet") == "s3://b/p/s/bucket=1/part 1.parquet"
    assert storage.data_file("s3://b/p/s", "s3a://b/p/s/x.parquet") == "s3://b/p/s/x.parquet"
    for bad in ("gs://b/p", "s3:///p", "s3://k:s@b/p"):
        with pytest.raises(storage.StorageError):
            storage.normalize(bad)
