"""Prometheus metrics: requests and latency per route template and status, store freshness.

Each worker process has its own registry; with ``--workers N`` a scrape sees one worker.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

disable_created_metrics()

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)


class StoreCollector(Collector):
    """Per-store (and per-stream) snapshot version, refresh age and refresh errors, read at
    scrape time."""

    def __init__(self, readiness: Callable[[], dict[str, Any]]) -> None:
        self._readiness = readiness

    def collect(self) -> Iterator[GaugeMetricFamily]:
        snap = GaugeMetricFamily("versiq_store_snapshot_version",
                                 "Delta version of the snapshot being served", labels=["store"])
        age = GaugeMetricFamily("versiq_store_refresh_age_seconds",
                                "Seconds since the store's last successful refresh",
                                labels=["store"])
        err = GaugeMetricFamily("versiq_store_refresh_error",
                                "1 when the store's last refresh failed", labels=["store"])
        ready = GaugeMetricFamily("versiq_ready", "1 when the service is ready")
        stream_snap = GaugeMetricFamily("versiq_stream_snapshot_version",
                                        "Delta version of the stream snapshot being served",
                                        labels=["stream"])
        stream_err = GaugeMetricFamily("versiq_stream_refresh_error",
                                       "1 when the stream's last refresh failed", labels=["stream"])
        refused = GaugeMetricFamily("versiq_store_refused",
                                    "1 for a store the engine refuses to serve", labels=["store"])
        try:
            state = self._readiness()
        except Exception:  # noqa: BLE001 - a scrape must not fail because the engine does
            state = {"ready": False, "stores": {}, "streams": {}, "refused": {}}
        ready.add_metric([], 1.0 if state.get("ready") else 0.0)
        for name, info in sorted(state.get("stores", {}).items()):
            if info.get("snapshot") is not None:
                snap.add_metric([name], float(info["snapshot"]))
            if info.get("lastRefreshAgeSeconds") is not None:
                age.add_metric([name], float(info["lastRefreshAgeSeconds"]))
            err.add_metric([name], 1.0 if info.get("error") else 0.0)
        for name, info in sorted(state.get("streams", {}).items()):
            if info.get("snapshot") is not None:
                stream_snap.add_metric([name], float(info["snapshot"]))
            stream_err.add_metric([name], 1.0 if info.get("error") else 0.0)
        for name in sorted(state.get("refused", {})):
            refused.add_metric([name], 1.0)
        yield from (snap, age, err, ready, refused, stream_snap, stream_err)


class Metrics:
    """``buffered``: the bytes of request bodies the process holds at scrape time
    (``bodies.BodyBudget``)."""

    def __init__(self, readiness: Callable[[], dict[str, Any]], buffered: Callable[[], float] = lambda: 0.0) -> None:
        self.registry = CollectorRegistry()
        Gauge("versiq_http_request_body_bytes_buffered", "Bytes of request bodies held by this process now",
              registry=self.registry).set_function(buffered)
        self.requests = Counter("versiq_http_requests", "HTTP requests by route template and status",
                                ["method", "route", "status"], registry=self.registry)
        self.latency = Histogram("versiq_http_request_duration_seconds",
                                 "HTTP request latency by route template and status",
                                 ["method", "route", "status"], buckets=LATENCY_BUCKETS,
                                 registry=self.registry)
        self.registry.register(StoreCollector(readiness))

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        labels = (method, route, str(status))
        self.requests.labels(*labels).inc()
        self.latency.labels(*labels).observe(seconds)
