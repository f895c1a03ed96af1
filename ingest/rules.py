"""The rule book: every decision of a store's run (docs/semantics.md, rules 1-12 and 19-22), once,
as SQL text that both engines execute.

Two executors arrange these expressions and run them: ``ingest.semantics`` in Spark (runs Spark
parses: large ones, Parquet, Kafka, S3) and ``ingest.decisions_here`` in DuckDB (runs parsed in the
driver). Each keeps only its physical strategy (which columns it materialises in which step, its
joins and shuffles, Spark's stream-time shortcuts); *what* a column means is written here and
nowhere else, so a rule changes in one edit. ``tests/ingest/test_decisions_here.py`` runs both
executors on random runs and compares every column; the reference model
(``tests/support/reference.py``) checks them against the rules independently.

A rule is a function from the SQL of its inputs to the SQL of its column. An input defaults to
the name of the column that holds it; an executor that has not materialised that column (Spark
saves a plan step by inlining) passes the input's own expression instead.

The columns, in the order they depend on each other (a record's check order: parse rules ->
``bad_partition`` -> ``partition_conflict`` -> ``duplicate_offset`` -> ``late``):

- ``p``: the record's stream-time partition (``partition``); ``home_run``/``home``: the key's
  home partition (its stored versions' partition, else that of its first record in the run that
  names a valid one), ``outcome0``/``detail0``: ``bad_partition``, ``partition_conflict``;
- ``ord0``: processing order inside a partition, the offset when every valid record of the
  partition has one (``offset_order``); ``dup``: a duplicate offset (``duplicate_offset``);
- ``st_before``: stream time before the record (``stream_time_before``); ``late``;
- ``latest``, ``replaced``, ``final``, ``valid_to``: the put decisions (``put_decisions``);
- ``outcome``, ``detail``: the first rule a record breaks, and its text for people.

The inputs an executor provides: the parsed record (``seq``, ``key``, ``value``, ``ts``, ``part``,
``offset``), the partition's state of earlier runs (``prev_st``, ``prev_off``), and for a key with
stored versions ``home_stored``, ``stored_max`` and, at a stored timestamp, ``stored_hit``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from versiq.durations import format_duration
from versiq.ingest.sqltext import MURMUR2_MOD_FUNCTION, crc32_mod_sql, sql_string
from versiq.layout import CRC32, MURMUR2
from versiq.timestamps import SQL_RFC3339_MS


@dataclass(frozen=True)
class Dialect:
    """How one engine spells the few things the two spell differently."""

    name: str
    #: ``printf``-style formatting (``%d``, ``%s``).
    format_function: str
    #: The quote of an identifier that is a keyword (``offset``, ``final``, ``partition``).
    quote: str
    #: A string literal.
    string: Callable[[str], str]
    #: ``crc32(UTF-8 bytes of key) mod n`` as an INT (``layout.bucket_of``).
    key_mod: Callable[[int], str]
    #: ``murmur2(UTF-8 bytes of key)`` made positive, ``mod n``, as an INT (``layout.murmur2_partition``).
    key_murmur2_mod: Callable[[int], str]
    #: The first non-null value of an expression over a window: ``(expr, window)`` -> SQL.
    first_non_null: Callable[[str, str], str]
    #: An epoch-ms expression as RFC 3339 UTC text for a valid date: ``(millis)`` -> SQL.
    iso_millis: Callable[[str], str]

    def q(self, name: str) -> str:
        return f"{self.quote}{name}{self.quote}"

    def default_partition(self, partitions: int, partitioner: str) -> str:
        """The key's default partition by the store's partitioner (``layout.default_partition_of``);
        with one partition the constant 0, so such a store never hashes its keys for it."""
        if int(partitions) == 1:
            return "CAST(0 AS INT)"
        if partitioner == MURMUR2:
            return self.key_murmur2_mod(partitions)
        if partitioner == CRC32:
            return self.key_mod(partitions)
        raise ValueError(f"unknown partitioner {partitioner!r}")

    def printf(self, template: str, *args: str) -> str:
        return f"{self.format_function}({self.string(template)}, {', '.join(args)})"

    def rfc3339(self, millis: str) -> str:
        """Epoch ms as the text of ``versiq.timestamps.format_timestamp``; outside the years
        1-9999 (``SQL_RFC3339_MS``) as the milliseconds, which no date function overflows on."""
        low, high = SQL_RFC3339_MS
        return (f"CASE WHEN {millis} BETWEEN {low} AND {high} THEN {self.iso_millis(millis)} "
                f"ELSE concat(CAST({millis} AS STRING), ' ms since the epoch') END")


def _duckdb_string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


SPARK = Dialect(
    name="spark", format_function="format_string", quote="`", string=sql_string,
    key_mod=lambda n: crc32_mod_sql("key", n),
    key_murmur2_mod=lambda n: f"{MURMUR2_MOD_FUNCTION}(key, {int(n)})",
    first_non_null=lambda expr, window: f"first({expr}, true) OVER ({window})",
    iso_millis=lambda ms: f"""date_format(timestamp_millis({ms}), "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'")""",
)

#: DuckDB: the executor provides ``crc`` (the key's CRC-32) and, for a store that needs it,
#: ``murmur2`` (the key's positive murmur2; ``decisions_here.with_key_crc``).
DUCKDB = Dialect(
    name="duckdb", format_function="printf", quote='"', string=_duckdb_string,
    key_mod=lambda n: f"CAST(crc % {int(n)} AS INT)",
    key_murmur2_mod=lambda n: f"CAST(murmur2 % {int(n)} AS INT)",
    first_non_null=lambda expr, window: f"first_value({expr} IGNORE NULLS) OVER ({window})",
    iso_millis=lambda ms: f"strftime(epoch_ms({ms}), '%Y-%m-%dT%H:%M:%S.%gZ')",
)

#: Processing order inside a partition (``ord0``: the offset when the partition is ordered by
#: offsets; ``seq``: source file and position, ``ingest.order``).
ORDER = "ord0 ASC NULLS FIRST, seq ASC"
#: The rows of a window before the current one.
BEFORE = "ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING"
#: Processing order inside a key (a key's accepted records share one partition).
KEY_ORDER = "coalesce(ord0, seq)"


# -- partitions (rules 19-21) --------------------------------------------------------------------

def bad_partition(partitions: int) -> str:
    """A record that names a partition outside ``[0, partitions)``."""
    return f"(part IS NOT NULL AND part >= {int(partitions)})"


def partition(d: Dialect, partitions: int, partitioner: str) -> str:
    """``p``: the partition a record names, else its key's default partition by the store's
    ``partitioner``; null when it names a bad one (any int64 there must not reach the INT cast:
    it would overflow)."""
    return (f"CASE WHEN {bad_partition(partitions)} THEN CAST(NULL AS INT) WHEN part IS NOT NULL "
            f"THEN CAST(part AS INT) ELSE {d.default_partition(partitions, partitioner)} END")


def home_run(d: Dialect, partitions: int, explicit_partitions: bool) -> str:
    """The partition of the key's first record in the run (by ``seq``) that names a valid one.
    Without explicit partitions every record's partition is its key's default one: ``p``."""
    if not explicit_partitions:
        return "p"
    return d.first_non_null(f"CASE WHEN NOT {bad_partition(partitions)} THEN p END",
                            "PARTITION BY key ORDER BY seq ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING")


def home(stored: bool, home_run: str = "home_run") -> str:
    """The key's home partition: that of its stored versions, else ``home_run``."""
    return f"coalesce(home_stored, {home_run})" if stored else home_run


def _conflict(partitions: int, home: str) -> str:
    return f"(NOT {bad_partition(partitions)} AND p != {home})"


def outcome0(partitions: int, home: str) -> str:
    """``bad_partition`` or ``partition_conflict`` (a record naming another partition than its
    key's home), else null."""
    return (f"CASE WHEN {bad_partition(partitions)} THEN 'bad_partition' "
            f"WHEN {_conflict(partitions, home)} THEN 'partition_conflict' END")


def detail0(d: Dialect, partitions: int, home: str) -> str:
    bad = d.printf("partition %d is not in [0, %d)", "part", str(int(partitions)))
    conflict = d.printf("key belongs to partition %d, record names partition %d", home, "p")
    return f"CASE WHEN {bad_partition(partitions)} THEN {bad} WHEN {_conflict(partitions, home)} THEN {conflict} END"


def valid0(outcome0: str = "outcome0") -> str:
    return f"(({outcome0}) IS NULL)"


# -- offsets -------------------------------------------------------------------------------------

def offset_order(d: Dialect, valid0: str = "valid0") -> str:
    """``ord0``: a partition is ordered by offsets when every valid record of it has one."""
    return (f"CASE WHEN count(CASE WHEN {valid0} THEN 1 END) OVER (PARTITION BY p) = "
            f"count(CASE WHEN {valid0} THEN {d.q('offset')} END) OVER (PARTITION BY p) THEN {d.q('offset')} END")


def duplicate_offset(d: Dialect, valid0: str = "valid0") -> str:
    """``dup``: an offset at or below the partition's highest offset of earlier runs, or one that
    an earlier valid record of the run has."""
    offset = d.q("offset")
    return (f"({valid0} AND {offset} IS NOT NULL AND ((prev_off IS NOT NULL AND {offset} <= prev_off) OR "
            f"row_number() OVER (PARTITION BY p, {offset}, {valid0} ORDER BY {ORDER}) > 1))")


def valid1(valid0: str = "valid0", dup: str = "dup") -> str:
    return f"({valid0} AND NOT {dup})"


# -- stream time and lateness (rules 1-3, 19-22) -------------------------------------------------

#: A valid record's timestamp, else null (a rejected record never moves stream time).
VALID_TS = "CASE WHEN valid1 THEN ts END"


#: The running maximum of the valid timestamps before a record in its partition's processing
#: order, with the partition's stream time of earlier runs (``prev_st``).
RUNNING_STREAM_TIME = f"greatest(prev_st, max({VALID_TS}) OVER (PARTITION BY p ORDER BY {ORDER} {BEFORE}))"


def stream_time_before(running: str = RUNNING_STREAM_TIME, valid1: str = "valid1") -> str:
    """``st_before`` of a valid record: ``RUNNING_STREAM_TIME``. (A late record is below that
    maximum, so counting it changes nothing: one window gives the record-at-a-time answer.) An
    executor may compute the same ``running`` value another way (Spark's large first builds,
    ``semantics._running_stream_time``)."""
    return f"(CASE WHEN {valid1} THEN {running} END)"


def late(kind: str, retention_ms: int, st_before: str = "st_before", valid1: str = "valid1") -> str:
    """A versioned store rejects a record older than stream time minus the history retention
    (its grace period); a timestamped store has no grace period."""
    if kind == "timestamped":
        return "false"
    return f"({valid1} AND {st_before} IS NOT NULL AND ts < {st_before} - {int(retention_ms)})"


def accepted(valid1: str = "valid1", late: str = "late") -> str:
    return f"({valid1} AND NOT {late})"


# -- puts (rules 4-5, 12) ------------------------------------------------------------------------

def put_decisions(kind: str, by_key: str) -> tuple[str, str, str, str]:
    """``latest``, ``replaced``, ``final`` and ``valid_to`` of an accepted record over its key's
    window ``by_key`` (a ``PARTITION BY`` clause of the key and ``accepted``), with ``ord`` the
    key's processing order (``KEY_ORDER``).

    Versioned: a key's accepted records ordered by (timestamp desc, processing order desc); the
    rows before a record are the records with a greater timestamp plus the same-timestamp ones
    processed after it, so a put is *latest* when no row before it was processed earlier (and
    it is at or past the newest stored version), *replaced* when an earlier record or a stored
    version has its timestamp, and *final* (the version that stays) when the previous row has
    a greater timestamp, which is then its ``valid_to``. Timestamped: one value per key, the
    last in processing order."""
    if kind == "timestamped":
        w = f"({by_key} ORDER BY ord)"
        prev_ts = f"coalesce(lag(ts) OVER {w}, stored_max)"
        return f"({prev_ts} IS NULL OR ts >= {prev_ts})", "false", f"(lead(ord) OVER {w} IS NULL)", \
            "CAST(NULL AS BIGINT)"
    w = f"({by_key} ORDER BY ts DESC, ord DESC)"
    processed_before = f"min(ord) OVER ({by_key} ORDER BY ts DESC, ord DESC {BEFORE})"
    latest_sql = (f"((stored_max IS NULL OR ts >= stored_max) AND "
                  f"({processed_before} IS NULL OR {processed_before} > ord))")
    replaced = f"(stored_hit IS NOT NULL OR coalesce(lead(ts) OVER {w} = ts, false))"
    newer = f"lag(ts) OVER {w}"
    return latest_sql, replaced, f"({newer} IS NULL OR {newer} != ts)", newer


# -- the outcome ---------------------------------------------------------------------------------

#: A record's outcome: the first rule it breaks (check order), else ``accepted``.
OUTCOME = ("coalesce(outcome0, CASE WHEN dup THEN 'duplicate_offset' END, CASE WHEN late THEN 'late' END, "
           "'accepted')")


def detail(d: Dialect, retention_ms: int) -> str:
    """The text people read beside a rejection."""
    retention = int(retention_ms)
    late_text = d.printf("timestamp %s (%d) is older than stream time %s minus history retention %s (horizon %s)",
                         d.rfc3339("ts"), "ts", d.rfc3339("st_before"), d.string(format_duration(retention)),
                         d.rfc3339(f"st_before - {retention}"))
    duplicate_text = d.printf("offset %d of partition %d was already processed", d.q("offset"), "p")
    return (f"coalesce(detail0, CASE WHEN dup THEN {duplicate_text} END, "
            f"CASE WHEN late THEN {late_text} END)")


# -- the store rows a run writes (rules 4-5) -----------------------------------------------------
# ``merged``: the final versions of the run (``src`` 1) and the stored versions of its keys
# (``src`` 0, with their ``old_valid_to``), one row per (key, valid_from) and source.

def kept_version(by_key: str) -> str:
    """True for the row of a (key, valid_from) that stays: the run's version replaces a stored
    one at the same timestamp."""
    return f"lag(valid_from) OVER ({by_key} ORDER BY valid_from, src DESC) IS DISTINCT FROM valid_from"


def merged_valid_to(by_key: str) -> str:
    """A kept version's ``valid_to``: the key's next version."""
    return f"lead(valid_from) OVER ({by_key} ORDER BY valid_from)"


#: A row the run writes: a new version, or a stored one whose ``valid_to`` changed.
WRITTEN = "src = 1 OR valid_to IS DISTINCT FROM old_valid_to"
