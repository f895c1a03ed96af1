"""One pipeline run, the whole ingest: every source store, then every source stream, then the
derived tables that read them (``ingest.derived.derive``). This is what ``versiq ingest`` runs once
(batch) or each time its sources hold something new (``--continuous``)."""

from __future__ import annotations

from typing import Any

from versiq.ingest.config import Pipeline
from versiq.ingest.derived.derive import derive
from versiq.ingest.pipeline import ingest_each, run_ingest
from versiq.ingest.reports import RunReport, StreamReport
from versiq.ingest.streams import ingest_stream


def run_pipeline(spark: Any, warehouse: str, pipeline: Pipeline, *, lock_timeout_s: float = 60.0) -> RunReport:
    """Ingest every store and stream of the pipeline, then bring every derived table up to date.
    A failing store, stream or table is reported (``error``) and the others go on."""
    for stream in pipeline.streams:
        stream.validate()
    report = run_ingest(spark, warehouse, pipeline.stores, lock_timeout_s=lock_timeout_s)
    report.streams.update(ingest_each(spark, pipeline.streams,
                                      lambda session, stream: ingest_stream(session, warehouse, stream,
                                                                            lock_timeout_s),
                                      lambda error: StreamReport(error=error), "stream"))
    if pipeline.tables:
        report.tables.update(derive(spark, warehouse, pipeline, lock_timeout_s))
    return report
