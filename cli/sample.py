"""A deterministic, realistic sample changelog: product prices over ~30 days of event time.

``versiq generate`` and ``versiq demo`` write it. Each record is a price change of one product::

    {"key":"sku-00042","value":{"price":12.50,"currency":"EUR","stock":3},"timestamp":1709294400000}

Number text is written as-is (``12.50`` keeps its trailing zero), timestamps are epoch ms or
RFC 3339 instants (``Z`` or an offset). The records are in *processing order*: the files sort by
name and are read line by line (docs/semantics.md, rules 19-21), and that order is built so that the outcome of
every record under the demo store's settings (``kind: versioned``, history retention 7 days,
one stream-time partition) is known by construction:

- about 10% **out-of-order** records: a version that arrives after the next version of its key,
  but less than the grace period after stream time, so it is accepted (rule 4);
- a few **late** records, older than ``streamTime - 7d`` when they arrive: rejected ``late``;
- about 1% **tombstones** (a product delisted; ``"value": null`` or no ``value`` member);
- a few **same-timestamp replacements** (a price correction for an existing version, rule 1);
- six **malformed** lines: two bad JSON, two without a key, two with a bad timestamp.

``SampleSummary`` holds the resulting counts (what an ingest report must say) and three example
keys with the answers the HTTP API must give for them. It is also written as ``_summary.json``
next to the data (a name the ingest ignores). With more than one stream-time partition the
grace check sees lower stream times, so the ``late`` count holds for one partition only.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import os
import random
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from versiq.cli.options import Invocation, add_logging
from versiq.timestamps import format_timestamp

log = logging.getLogger(__name__)

FORMATS = ("jsonl", "csv", "parquet")
SUMMARY_FILE = "_summary.json"
#: History retention (= grace period) the sample is built for: the demo store's setting.
HISTORY_RETENTION_MS = 7 * 86_400_000
#: Event time starts here (2024-03-01T00:00:00Z) and spans 30 days.
START_MS = 1_709_251_200_000
SPAN_MS = 30 * 86_400_000
OUT_OF_ORDER_FRACTION = 0.10
TOMBSTONE_PROBABILITY = 0.011
_HOUR = 3_600_000
_FILE_PATTERN = re.compile(r"part-\d+\.(jsonl|csv|parquet)\Z")

#: The malformed lines, each kind twice (two variants).
_MALFORMED_KINDS = ("bad_json", "bad_json", "missing_key", "missing_key", "bad_timestamp", "bad_timestamp")


@dataclass(frozen=True)
class ExampleRecord:
    """One version as the HTTP API returns it: value (JSON text), timestamp, validTo."""

    value: str
    timestamp: int
    valid_to: int | None


@dataclass(frozen=True)
class SampleExample:
    """A key with the answers the demo store gives for it (one snapshot after the full ingest)."""

    key: str
    latest: ExampleRecord
    as_of: int
    as_of_answer: ExampleRecord
    versions_from: int
    versions_to: int
    versions: list[ExampleRecord]


@dataclass
class SampleSummary:
    """What was written, and what an ingest of it into the demo store must report."""

    out_dir: str
    format: str
    seed: int
    files: list[str]
    keys: int
    #: Non-blank lines (rows) written = the ingest report's ``read``.
    lines: int
    #: Well-formed records (``lines`` minus the malformed ones).
    records: int
    accepted_latest: int
    out_of_order: int
    late: int
    tombstones: int
    replaced_same_timestamp: int
    #: Malformed lines by what is wrong with them: bad_json, missing_key, bad_timestamp.
    malformed: dict[str, int]
    #: Reason code -> count an ingest of this format must report (every code, zeros included).
    expected_rejected: dict[str, int]
    history_retention_ms: int
    first_timestamp: int
    #: The store's stream time after the whole sample is ingested (the largest timestamp).
    stream_time: int
    examples: list[SampleExample] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    @staticmethod
    def from_json(text: str) -> SampleSummary:
        data = json.loads(text)
        examples = []
        for ex in data.pop("examples", []):
            examples.append(
                SampleExample(
                    key=ex["key"],
                    latest=ExampleRecord(**ex["latest"]),
                    as_of=ex["as_of"],
                    as_of_answer=ExampleRecord(**ex["as_of_answer"]),
                    versions_from=ex["versions_from"],
                    versions_to=ex["versions_to"],
                    versions=[ExampleRecord(**r) for r in ex["versions"]],
                )
            )
        return SampleSummary(**data, examples=examples)


def load_summary(out_dir: str | os.PathLike[str]) -> SampleSummary | None:
    """The summary of a sample already generated in ``out_dir``, or None."""
    path = Path(out_dir) / SUMMARY_FILE
    if not path.is_file():
        return None
    return SampleSummary.from_json(path.read_text(encoding="utf-8"))


@dataclass
class _Record:
    """A well-formed record in processing order; ``value`` None = tombstone."""

    key: str
    timestamp: int
    value: str | None
    arrival: int
    seq: int


@dataclass
class _Malformed:
    kind: str
    #: 0 or 1: each kind of malformed line comes in two variants.
    variant: int
    key: str
    timestamp: int
    value: str


def _price_text(cents: int) -> str:
    return f"{cents // 100}.{cents % 100:02d}"


def _value_text(cents: int, currency: str, stock: int) -> str:
    return f'{{"price":{_price_text(cents)},"currency":"{currency}","stock":{stock}}}'


def generate(
    out_dir: str | os.PathLike[str],
    keys: int = 5000,
    versions: int = 10,
    files: int = 4,
    fmt: str = "jsonl",
    seed: int = 7,
) -> SampleSummary:
    """Write the sample changelog to ``out_dir`` (created) and return its summary.

    ``versions`` is the mean number of versions per key. The same arguments always give the
    same bytes. Files of an earlier sample in ``out_dir`` are replaced; any other file there is
    an error (the ingest would read it too).
    """
    if keys < 1 or versions < 1 or files < 1:
        raise ValueError("keys, versions and files must be at least 1")
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r} (use one of {', '.join(FORMATS)})")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    foreign = [
        p.name for p in out.iterdir()
        if not p.name.startswith((".", "_")) and not _FILE_PATTERN.match(p.name)
    ]
    if foreign:
        listed = ", ".join(sorted(foreign)[:3])
        raise ValueError(f"{out} holds other files ({listed}); use an empty directory")
    for p in out.iterdir():
        if _FILE_PATTERN.match(p.name) or p.name == SUMMARY_FILE:
            p.unlink()

    rng = random.Random(seed)
    width = max(5, len(str(keys - 1)))
    key_names = [f"sku-{i:0{width}d}" for i in range(keys)]
    grace = HISTORY_RETENTION_MS

    # 1. Every key's versions: distinct timestamps over the span, a price random walk, a few
    #    tombstones (a product delisted, maybe listed again later).
    history: dict[str, list[tuple[int, str | None]]] = {}
    currency_of: dict[str, str] = {}
    for key in key_names:
        n = rng.randint(max(1, (versions + 1) // 2), versions + versions // 2)
        stamps = sorted(START_MS + t for t in rng.sample(range(SPAN_MS), n))
        currency = rng.choices(("EUR", "USD", "GBP"), weights=(7, 2, 1))[0]
        currency_of[key] = currency
        cents = rng.randint(199, 49_999)
        entries: list[tuple[int, str | None]] = []
        for j, ts in enumerate(stamps):
            if j > 0 and rng.random() < TOMBSTONE_PROBABILITY:
                entries.append((ts, None))
                continue
            cents = max(99, round(cents * (1 + rng.uniform(-0.08, 0.08))))
            if rng.random() < 0.5:
                cents = cents - cents % 5  # prices like 12.50 or 9.95
            entries.append((ts, _value_text(cents, currency, rng.randint(0, 250))))
        history[key] = entries
    total_versions = sum(len(v) for v in history.values())
    if not any(v is None for entries in history.values() for _, v in entries):
        # Small samples: make sure there is at least one tombstone.
        key = next((k for k in key_names if len(history[k]) > 1), key_names[0])
        ts, _ = history[key][-1]
        history[key][-1] = (ts, None)

    # 2. Out-of-order records: version j arrives shortly after version j+1 of its key, still
    #    within grace. Never two consecutive versions of a key, so j+1 has arrived for sure.
    eligible = [
        (key, j)
        for key in key_names
        for j in range(len(history[key]) - 1)
        if history[key][j + 1][0] - history[key][j][0] <= grace - 2 * _HOUR
    ]
    rng.shuffle(eligible)
    target = round(OUT_OF_ORDER_FRACTION * total_versions)
    displaced: set[tuple[str, int]] = set()
    for key, j in eligible:
        if len(displaced) >= target:
            break
        if (key, j - 1) in displaced or (key, j + 1) in displaced:
            continue
        displaced.add((key, j))

    records: list[_Record] = []
    seq = 0
    for key in key_names:
        entries = history[key]
        for j, (ts, value) in enumerate(entries):
            arrival = ts
            if (key, j) in displaced:
                gap = entries[j + 1][0] - ts
                arrival = entries[j + 1][0] + rng.randint(1000, min(12 * _HOUR, grace - _HOUR - gap))
            records.append(_Record(key, ts, value, arrival, seq))
            seq += 1

    # 3. Same-timestamp replacements: a price correction arriving shortly after the version it
    #    corrects and before the key's next version (so it is a *latest* put).
    replace_target = max(2, total_versions // 2000)
    candidates = [r for r in records if r.value is not None and r.arrival == r.timestamp]
    rng.shuffle(candidates)
    replaced: dict[tuple[str, int], str] = {}
    next_ts = {
        (key, ts): (entries[j + 1][0] if j + 1 < len(entries) else None)
        for key, entries in history.items()
        for j, (ts, _) in enumerate(entries)
    }
    for r in candidates:
        if len(replaced) >= replace_target:
            break
        nxt = next_ts[(r.key, r.timestamp)]
        room = _HOUR if nxt is None else min(_HOUR, (nxt - r.timestamp) // 2)
        if room < 2000:
            continue
        cents = rng.randint(199, 49_999)
        value = _value_text(cents, currency_of[r.key], rng.randint(0, 250))
        replaced[(r.key, r.timestamp)] = value
        records.append(_Record(r.key, r.timestamp, value, r.timestamp + rng.randint(1000, room), seq))
        seq += 1

    records.sort(key=lambda r: (r.arrival, r.seq))
    stream_time = max(r.timestamp for r in records)
    first_timestamp = min(r.timestamp for r in records)

    # 4. Late records: older than stream time minus the grace period where they arrive.
    ordered: list[_Record | _Malformed] = list(records)
    late_count = max(3, total_versions // 10_000)
    prefix_max: list[int] = []
    running = -1
    for r in records:
        running = max(running, r.timestamp)
        prefix_max.append(running)
    late_positions = sorted(rng.sample(range(len(records) // 2, len(records)), late_count), reverse=True)
    for pos in late_positions:
        key = rng.choice(key_names)
        ts = prefix_max[pos] - grace - rng.randint(_HOUR, 3 * 86_400_000)
        value = _value_text(rng.randint(199, 49_999), currency_of[key], rng.randint(0, 250))
        ordered.insert(pos + 1, _Record(key, ts, value, ts, -1))

    # 5. Malformed lines, spread over the files.
    for index, kind in enumerate(_MALFORMED_KINDS):
        pos = rng.randrange(len(ordered) + 1)
        key = rng.choice(key_names)
        ts = START_MS + rng.randrange(SPAN_MS)
        value = _value_text(rng.randint(199, 49_999), "EUR", 1)
        ordered.insert(pos, _Malformed(kind, _MALFORMED_KINDS[:index].count(kind), key, ts, value))

    # 6. Write: consecutive chunks of the processing order, one per file, in name order.
    digits = max(3, len(str(files - 1)))
    names = [f"part-{i:0{digits}d}.{fmt}" for i in range(files)]
    base, extra = divmod(len(ordered), files)
    start = 0
    for i, name in enumerate(names):
        size = base + (1 if i < extra else 0)
        chunk = ordered[start:start + size]
        start += size
        _WRITERS[fmt](out / name, chunk, random.Random(f"{seed}/{i}"))

    malformed = {kind: _MALFORMED_KINDS.count(kind) for kind in dict.fromkeys(_MALFORMED_KINDS)}
    from versiq.layout import REJECT_REASONS

    expected_rejected = dict.fromkeys(REJECT_REASONS, 0)
    expected_rejected["late"] = late_count
    expected_rejected["malformed" if fmt == "jsonl" else "bad_value"] = malformed["bad_json"]
    expected_rejected["missing_field"] = malformed["missing_key"]
    expected_rejected["bad_timestamp"] = malformed["bad_timestamp"]
    accepted = len(records)
    summary = SampleSummary(
        out_dir=str(out),
        format=fmt,
        seed=seed,
        files=names,
        keys=keys,
        lines=len(ordered),
        records=len(ordered) - len(_MALFORMED_KINDS),
        accepted_latest=accepted - len(displaced),
        out_of_order=len(displaced),
        late=late_count,
        tombstones=sum(1 for r in records if r.value is None),
        replaced_same_timestamp=len(replaced),
        malformed=malformed,
        expected_rejected=expected_rejected,
        history_retention_ms=grace,
        first_timestamp=first_timestamp,
        stream_time=stream_time,
    )
    final = {
        key: [(ts, replaced.get((key, ts), value)) for ts, value in entries]
        for key, entries in history.items()
    }
    summary.examples = _examples(final, stream_time - grace, stream_time, random.Random(seed + 1))
    (out / SUMMARY_FILE).write_text(summary.to_json(), encoding="utf-8")
    return summary


def _examples(
    final: dict[str, list[tuple[int, str | None]]], horizon: int, stream_time: int, rng: random.Random
) -> list[SampleExample]:
    """Three keys whose latest version is a value and that changed twice within retention."""
    keys = sorted(final)
    rng.shuffle(keys)
    found: list[SampleExample] = []
    for key in keys:
        entries = final[key]
        recent = [i for i, (ts, _) in enumerate(entries) if ts >= horizon]
        last_value = entries[-1][1]
        if len(recent) < 3 or last_value is None:
            continue
        a = recent[0]
        a_value = entries[a][1]
        if a_value is None:
            continue
        (ts_a, _), (ts_b, _) = entries[a], entries[a + 1]
        with_valid_to = [
            ExampleRecord(value, ts, entries[i + 1][0] if i + 1 < len(entries) else None)
            for i, (ts, value) in enumerate(entries)
            if value is not None
        ]
        found.append(
            SampleExample(
                key=key,
                latest=ExampleRecord(last_value, entries[-1][0], None),
                as_of=ts_a + (ts_b - ts_a) // 2,
                as_of_answer=ExampleRecord(a_value, ts_a, ts_b),
                versions_from=ts_a,
                versions_to=stream_time,
                # Rule 9 with from >= horizon: validity [ts, validTo) meets [from, to].
                versions=[
                    r for r in with_valid_to
                    if r.timestamp <= stream_time and (r.valid_to is None or r.valid_to > ts_a)
                ],
            )
        )
        if len(found) == 3:
            break
    return found


def _timestamp_text(ts: int, rng: random.Random) -> str:
    """Mostly epoch ms; some RFC 3339 instants in UTC or with a European offset."""
    roll = rng.random()
    if roll < 0.80:
        return str(ts)
    if roll < 0.95:
        return format_timestamp(ts)
    hours = rng.choice((1, 2))
    local = format_timestamp(ts + hours * _HOUR)
    return f"{local[:-1]}+0{hours}:00"


def _bad_timestamp(row: _Malformed) -> str:
    # An English word and a date-time without an offset (naive: its instant is unknown).
    return "yesterday" if row.variant == 0 else format_timestamp(row.timestamp)[:19]


def _write_jsonl(path: Path, rows: list[_Record | _Malformed], rng: random.Random) -> None:
    lines = []
    for row in rows:
        if isinstance(row, _Malformed):
            if row.kind == "bad_json":
                lines.append(
                    f'{{"key":"{row.key}","value":{row.value[:-12]}'  # cut off mid-object
                    if row.variant == 0 else  # a stray closing brace: trailing garbage
                    f'{{"key":"{row.key}","value":{row.value},"timestamp":{row.timestamp}}}}}'
                )
            elif row.kind == "missing_key":
                key_member = "" if row.variant == 0 else '"key":"",'
                lines.append(f'{{{key_member}"value":{row.value},"timestamp":{row.timestamp}}}')
            else:
                ts_text = json.dumps(_bad_timestamp(row))
                lines.append(f'{{"key":"{row.key}","value":{row.value},"timestamp":{ts_text}}}')
            continue
        text = _timestamp_text(row.timestamp, rng)
        ts_json = text if text.isdigit() else f'"{text}"'
        if row.value is None:
            value_member = '"value":null,' if rng.random() < 0.5 else ""
        else:
            value_member = f'"value":{row.value},'
        lines.append(f'{{"key":"{row.key}",{value_member}"timestamp":{ts_json}}}')
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _write_csv(path: Path, rows: list[_Record | _Malformed], rng: random.Random) -> None:
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(["key", "value", "timestamp"])
        for row in rows:
            if isinstance(row, _Malformed):
                if row.kind == "bad_json":
                    writer.writerow([row.key, row.value[:-12], row.timestamp])
                elif row.kind == "missing_key":
                    writer.writerow(["", row.value, row.timestamp])
                else:
                    writer.writerow([row.key, row.value, _bad_timestamp(row)])
                continue
            writer.writerow([row.key, row.value or "", _timestamp_text(row.timestamp, rng)])


def _write_parquet(path: Path, rows: list[_Record | _Malformed], rng: random.Random) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    keys: list[str | None] = []
    values: list[str | None] = []
    stamps: list[int] = []
    for row in rows:
        if isinstance(row, _Malformed):
            keys.append((None if row.variant == 0 else "") if row.kind == "missing_key" else row.key)
            values.append(row.value[:-12] if row.kind == "bad_json" else row.value)
            # Epoch ms must be non-negative: a negative int64 is a bad timestamp.
            stamps.append(-1 - row.variant if row.kind == "bad_timestamp" else row.timestamp)
            continue
        keys.append(row.key)
        values.append(row.value)
        stamps.append(row.timestamp)
    table = pa.table(
        {
            "key": pa.array(keys, pa.string()),
            "value": pa.array(values, pa.string()),
            "timestamp": pa.array(stamps, pa.int64()),
        }
    )
    pq.write_table(table, path, row_group_size=65_536)


_WRITERS = {"jsonl": _write_jsonl, "csv": _write_csv, "parquet": _write_parquet}


def describe(summary: SampleSummary) -> str:
    """A few human-readable lines about a generated sample."""
    rejected = ", ".join(f"{k} {v}" for k, v in summary.expected_rejected.items() if v)
    return (
        f"{summary.lines} lines for {summary.keys} keys in {len(summary.files)} {summary.format} "
        f"file(s) under {summary.out_dir}, event time {format_timestamp(summary.first_timestamp)} .. "
        f"{format_timestamp(summary.stream_time)}\n"
        f"  with history retention {summary.history_retention_ms // 86_400_000}d an ingest accepts "
        f"{summary.accepted_latest} latest + {summary.out_of_order} out-of-order records "
        f"({summary.tombstones} tombstones, {summary.replaced_same_timestamp} same-timestamp "
        f"replacements) and rejects {rejected}"
    )


def generate_command(args: argparse.Namespace) -> int:
    """``versiq generate``: write the sample and print what it holds."""
    try:
        summary = generate(args.out, args.keys, args.versions, args.files, args.format, args.seed)
    except ValueError as exc:
        print(f"versiq generate: {exc}", file=sys.stderr)
        return 2
    print(describe(summary))
    print(f"  summary with example keys: {Path(summary.out_dir) / SUMMARY_FILE}")
    return 0


def _generate(inv: Invocation) -> int:
    return generate_command(inv.args)


def add_generate(sub: Any) -> None:
    gen = sub.add_parser(
        "generate",
        help="write a sample changelog (product prices) to a directory",
        description="Write a deterministic sample changelog with out-of-order records, late "
        "records past grace, tombstones and a few malformed lines.",
    )
    gen.add_argument("--out", required=True, help="output directory")
    gen.add_argument("--keys", type=int, default=5000, help="number of keys (default 5000)")
    gen.add_argument("--versions", type=int, default=10, help="versions per key (default 10)")
    gen.add_argument("--files", type=int, default=4, help="number of files (default 4)")
    gen.add_argument("--format", choices=("jsonl", "csv", "parquet"), default="jsonl")
    gen.add_argument("--seed", type=int, default=7, help="random seed (default 7)")
    add_logging(gen)
    gen.set_defaults(run=_generate)
