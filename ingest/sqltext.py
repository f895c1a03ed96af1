"""Spark SQL text for the layout's functions, for plans built from SQL expressions (one py4j
call per expression, instead of one per ``Column`` call: ``ingest.semantics``)."""

from __future__ import annotations

from versiq.ingest.order import POS_BITS
from versiq.layout import MURMUR2_M, MURMUR2_SEED


def sql_string(text: str) -> str:
    """``text`` as a Spark SQL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def crc32_mod_sql(column: str, n: int) -> str:
    """CRC-32 of the UTF-8 bytes of ``column`` modulo ``n``, as an INT: ``versiq.layout.bucket_of``
    (``n`` = buckets) and ``versiq.layout.default_partition_of`` (``n`` = partitions) in Spark."""
    return f"CAST(pmod(crc32(encode({column}, 'UTF-8')), {int(n)}) AS INT)"


def murmur2_mod_sql(column: str, n: int) -> str:
    """Kafka's default partition of the UTF-8 bytes of ``column`` among ``n`` (``toPositive(murmur2)
    mod n``, ``versiq.layout.murmur2_partition``) as an INT, in Spark SQL: Spark has no murmur2.

    The hash is an unsigned 32-bit int held in a BIGINT, each product masked back to 32 bits (the
    product of two such ints stays below 2^63, so ANSI mode never overflows). The key's bytes are
    read from its hex text, each 4-byte block little-endian (its byte pairs in reverse order);
    the blocks are mixed into the seed by ``aggregate`` and the tail bytes and the final mix come
    in its finishing function, a local value being a one-element ``transform``."""
    m, mask = f"{MURMUR2_M}L", "4294967295L"
    hx = f"hex(encode({column}, 'UTF-8'))"

    def mul(x: str) -> str:
        return f"(({x}) * {m} & {mask})"

    def let(value: str, var: str, body: str) -> str:
        return f"element_at(transform(array({value}), {var} -> {body}), 1)"

    def hexint(pairs: list[str]) -> str:
        return f"CAST(conv(concat({', '.join(pairs)}), 16, 10) AS BIGINT)"

    block = hexint([f"substr(_mh, 8 * _mi + {o}, 2)" for o in (7, 5, 3, 1)])
    blocks = (f"transform(slice(sequence(0, length(_mh) DIV 8), 1, CAST(length(_mh) DIV 8 AS INT)), "
              f"_mi -> {mul(block)})")
    mixed = f"transform({blocks}, _mk -> {mul('_mk ^ shiftright(_mk, 24)')})"
    tail_at = "length(_mh) DIV 8 * 8"
    tail = hexint([f"substr(_mh, {tail_at} + {o}, 2)" for o in (5, 3, 1)])
    with_tail = f"CASE WHEN length(_mh) % 8 > 0 THEN {mul(f'_mt ^ {tail}')} ELSE _mt END"
    final = let(mul(let(with_tail, "_m1", "_m1 ^ shiftright(_m1, 13)")), "_m2", "_m2 ^ shiftright(_m2, 15)")
    hashed = (f"aggregate({mixed}, ({MURMUR2_SEED}L ^ length(_mh) DIV 2), (_mh2, _mk2) -> "
              f"{mul('_mh2')} ^ _mk2, _mt -> {final})")
    return f"CAST((({let(hx, '_mh', hashed)}) & 2147483647) % {int(n)} AS INT)"


def file_of_sql(seq: str) -> str:
    """The file index of a ``seq`` (``ingest.order``): files are processed in index order."""
    return f"CAST(shiftright({seq}, {POS_BITS}) AS INT)"
