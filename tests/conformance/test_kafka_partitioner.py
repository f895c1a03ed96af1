"""The ``murmur2`` partitioner against Kafka's own: every spelling of it in versiq (the layout's
Python, its vectorised numpy, the Spark session's function the rule book calls and its DuckDB executor) gives, for keys
of every length and script, the ``Utils.murmur2`` hash and the default partition Kafka's producer
gives (``conformance/kafka``, Partitions.java, the real kafka-clients classes)."""

from __future__ import annotations

import random

import duckdb
import pyarrow as pa
import pytest

from tests.support.kafka_streams import run_partitions
from versiq import layout
from versiq.ingest import rules
from versiq.ingest.decisions_here import with_key_crc

PARTITIONS = (1, 2, 3, 7, 12, 1000, 10_000)


def _keys() -> list[str]:
    rnd = random.Random(20240519)
    fixed = ["", "a", "ab", "abc", "abcd", "abcde", "abcdef", "abcdefg", "abcdefgh", "key-1", "é", "日本語のキー",
             "emoji 😀", "ÿÿÿÿÿ", "\u0080\u07ff\u0800\uffff", "x" * 4096, "é" * 2048, '{"id":1}']
    alphabet = [chr(c) for c in (*range(32, 127), 0xE9, 0x3B1, 0x4E2D, 0x1F600, 0xFFFD, 0x7F, 0x80)]
    drawn = ["".join(rnd.choice(alphabet) for _ in range(rnd.randrange(0, 40))) for _ in range(300)]
    return fixed + drawn


KEYS = _keys()


@pytest.fixture(scope="module")
def kafka() -> dict[tuple[str, int], dict[str, int]]:
    """Kafka's answer per (key, partitions): one JVM for all of them."""
    scenarios = [{"key": key, "partitions": n} for key in KEYS for n in PARTITIONS]
    results = run_partitions(scenarios)
    return {(s["key"], s["partitions"]): r for s, r in zip(scenarios, results, strict=True)}


@pytest.mark.rule(19)
def test_python_murmur2_is_kafkas(kafka):
    for key in KEYS:
        data = key.encode("utf-8")
        signed = layout.murmur2(data) - (1 << 32 if layout.murmur2(data) >= 1 << 31 else 0)
        assert signed == kafka[(key, 1)]["murmur2"], key
        for n in PARTITIONS:
            assert layout.default_partition_of(key, n, layout.MURMUR2) == kafka[(key, n)]["partition"], (key, n)
    assert any(kafka[(key, 1)]["murmur2"] < 0 for key in KEYS)  # the sign bit is exercised


@pytest.mark.rule(19)
def test_vectorised_and_duckdb_murmur2_are_kafkas(kafka):
    table = with_key_crc(pa.table({"key": pa.array(KEYS, pa.string())}), murmur2=True)
    for n in PARTITIONS:
        assert layout.Partitioning(n, layout.MURMUR2).of_keys(table.column("key")).tolist() == \
            [kafka[(key, n)]["partition"] for key in KEYS], n
        con = duckdb.connect()
        con.register("t", table)
        got = [row[0] for row in con.sql(f"SELECT {rules.DUCKDB.default_partition(n, layout.MURMUR2)} FROM t")
               .fetchall()]
        con.close()
        assert got == [kafka[(key, n)]["partition"] for key in KEYS], n


@pytest.mark.rule(19)
def test_spark_murmur2_is_kafkas(spark, kafka):
    frame = spark.createDataFrame([(key,) for key in KEYS], "key string")
    exprs = [f"{rules.SPARK.default_partition(n, layout.MURMUR2)} AS p{n}" for n in PARTITIONS]
    rows = frame.selectExpr("key", *exprs).collect()
    for row in rows:
        for n in PARTITIONS:
            assert row[f"p{n}"] == kafka[(row["key"], n)]["partition"], (row["key"], n)


@pytest.mark.rule(19)
def test_the_partitioner_is_a_setting_stores_without_one_keep_crc32():
    """A store's partitioner is in its settings from its creation on; settings written before
    the setting existed name none and keep the crc32 placement their keys already have."""
    legacy = '{"buckets": 16, "historyRetentionMs": 1, "kind": "versioned", "partitions": 2, "versiq.format": 1}'
    assert layout.StoreSettings.from_description(legacy).partitioner == layout.CRC32
    new = layout.StoreSettings("versioned", 1, 2)
    assert new.partitioner == layout.MURMUR2
    assert layout.StoreSettings.from_description(new.to_description()) == new
    with pytest.raises(ValueError, match="partitioner"):
        layout.StoreSettings.from_description(legacy.replace('"buckets"', '"partitioner": "fnv", "buckets"'))
    assert layout.default_partition_of("d", 2, layout.CRC32) == 0
    assert layout.default_partition_of("d", 2, layout.MURMUR2) == 1
