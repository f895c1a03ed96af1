"""Spark SQL text for the layout's functions, for plans built from SQL expressions (one py4j
call per expression, instead of one per ``Column`` call: ``ingest.semantics``)."""

from __future__ import annotations

from versiq.ingest.order import POS_BITS


def sql_string(text: str) -> str:
    """``text`` as a Spark SQL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def crc32_mod_sql(column: str, n: int) -> str:
    """CRC-32 of the UTF-8 bytes of ``column`` modulo ``n``, as an INT: ``versiq.layout.bucket_of``
    (``n`` = buckets) and ``versiq.layout.default_partition_of`` (``n`` = partitions) in Spark."""
    return f"CAST(pmod(crc32(encode({column}, 'UTF-8')), {int(n)}) AS INT)"


#: Kafka's default partition of a key among ``n`` (``layout.murmur2_partition``), a SQL function
#: each session gets from ``spark.register_functions``: ``versiq_murmur2_mod(key, n)``. (Spark has
#: no murmur2; spelled in SQL, its blocks and bytes as lambdas, it cost about 30 s per million keys
#: on two cores, where the function hashes each batch of keys at once with numpy.)
MURMUR2_MOD_FUNCTION = "versiq_murmur2_mod"


def file_of_sql(seq: str) -> str:
    """The file index of a ``seq`` (``ingest.order``): files are processed in index order."""
    return f"CAST(shiftright({seq}, {POS_BITS}) AS INT)"
