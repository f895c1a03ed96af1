"""What a run reports (the ``--report`` file and the printed summary, docs/contract.md): one
report per store, stream and derived table, and the run's whole report.

Every report has the rejected records by reason (every code, zeros included), the snapshot the
run committed, its wall time, its run number and, when it failed, its error; stores and derived
tables add the put outcomes of their records (docs/semantics.md rule 4).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from versiq.layout import REJECT_REASONS


def report_json(report: Any) -> dict[str, Any]:
    """A run report dataclass's JSON form (``--report``, docs/contract.md): every field in order,
    ``seconds`` rounded to the millisecond, ``error`` only when there is one."""
    out: dict[str, Any] = {}
    for item in fields(report):
        value = getattr(report, item.name)
        if item.name in ("error", "kafka") and value is None:
            continue
        if item.name == "seconds":
            value = round(value, 3)
        elif isinstance(value, dict):
            value = dict(value)
        out[item.name] = value
    return out


def _all_reasons() -> dict[str, int]:
    return dict.fromkeys(REJECT_REASONS, 0)


@dataclass
class Report:
    """What every run report has."""

    rejected: dict[str, int] = field(default_factory=_all_reasons)
    snapshot: int | None = None
    seconds: float = 0.0
    run: int | None = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return report_json(self)


@dataclass
class PutOutcomes(Report):
    """A versioned or timestamped table's run: the put outcome of every accepted record."""

    accepted_latest: int = 0
    accepted_out_of_order: int = 0
    replaced_same_timestamp: int = 0
    tombstones: int = 0


@dataclass
class StoreReport(PutOutcomes):
    """A source store's run."""

    read: int = 0
    files: int = 0
    #: Source entries that are not regular files, never opened (``ingest.sources``).
    ignored: list[dict[str, str]] = field(default_factory=list)
    #: Records read that are neither records nor rejections, by kind (Debezium's delete
    #: markers, ``records.kafka_rows.SKIPPED``).
    skipped: dict[str, int] = field(default_factory=dict)
    #: Kafka sources: the topic, the offsets read per partition and the gaps allowed (``ingest.kafka``).
    kafka: dict[str, Any] | None = None


@dataclass
class StreamReport(Report):
    """A source stream's run: records read, appended and rejected (no grace: never late)."""

    read: int = 0
    appended: int = 0
    files: int = 0
    ignored: list[dict[str, str]] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)
    kafka: dict[str, Any] | None = None


@dataclass
class TableReport(PutOutcomes):
    """A derived table's (or stream output's) run: what its operator emitted and how its store
    took the results."""

    kind: str = field(default="versioned", kw_only=True)
    emitted: int = 0
    inputs: dict[str, int] = field(default_factory=dict)


@dataclass
class RunReport:
    stores: dict[str, StoreReport] = field(default_factory=dict)
    streams: dict[str, StreamReport] = field(default_factory=dict)
    #: Derived tables and stream outputs (``ingest.derived.report.TableReport``).
    tables: dict[str, Any] = field(default_factory=dict)

    def _entries(self) -> list[tuple[str, Any]]:
        """Every store's, stream's and table's report by name (one warehouse namespace: the
        names are unique)."""
        return [*self.stores.items(), *self.streams.items(), *self.tables.items()]

    @property
    def failed(self) -> bool:
        return any(entry.error is not None for _name, entry in self._entries())

    @property
    def committed(self) -> list[str]:
        """The stores, streams and tables this run committed to."""
        return [name for name, entry in self._entries() if entry.run is not None]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"stores": {name: r.to_json() for name, r in self.stores.items()}}
        if self.streams:
            out["streams"] = {name: r.to_json() for name, r in self.streams.items()}
        if self.tables:
            out["tables"] = {name: r.to_json() for name, r in self.tables.items()}
        return out
