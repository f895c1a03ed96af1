"""The Kafka Streams side of the differential tests (issue 13): builds and runs the Java harness in
conformance/kafka/ (Kafka Streams and its TopologyTestDriver, the version pinned in its pom.xml),
many scenarios per JVM start.

``make test`` builds the harness first (``make conformance-jar``); run alone, the tests build it
here with Maven, caching artifacts under ``.cache/m2`` (git-ignored).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import zlib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ROOT / "conformance" / "kafka"
JAR = HARNESS / "target" / "versiq-conformance-1.jar"
KAFKA_VERSION = "4.3.1"


def build() -> Path:
    """The harness jar, built with Maven when missing or older than its sources. Test workers
    (pytest-xdist) take turns on a lock file: one builds, the others then find the jar fresh."""
    sources = [HARNESS / "pom.xml", *HARNESS.glob("src/**/*.java")]

    def fresh() -> bool:
        return JAR.exists() and all(JAR.stat().st_mtime >= s.stat().st_mtime for s in sources)

    if fresh():
        return JAR
    lock = ROOT / ".cache" / "conformance-build.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        if fresh():
            return JAR
        mvn = shutil.which("mvn")
        if mvn is None:
            raise RuntimeError("Maven (mvn) is needed to build conformance/kafka: apt-get install maven")
        subprocess.run([mvn, "-q", "-B", f"-Dmaven.repo.local={ROOT / '.cache' / 'm2'}", "-f",
                        str(HARNESS / "pom.xml"), "package", "-DskipTests"], check=True, timeout=1200)
    return JAR


def run_store_scenarios(scenarios: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Kafka's answers for ``scenarios`` (the input format of StoreScenarios.java), in order."""
    return _run("StoreScenarios", scenarios)


def run_operator_scenarios(scenarios: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What Kafka emits for ``scenarios`` (the input format of OperatorScenarios.java), in order."""
    return _run("OperatorScenarios", scenarios)


def run_partitions(scenarios: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Kafka's ``Utils.murmur2`` and default partition of each ``{"key", "partitions"}`` (Partitions.java)."""
    return _run("Partitions", scenarios)


def java_command(main: str) -> list[str]:
    """``java -cp <the harness> dev.versiq.conformance.<main>``: the jar (built when stale) and its
    ``lib/``. ``VERSIQ_CONFORMANCE_CLASSES`` (a folder of classes compiled from these sources,
    e.g. ``javac -d DIR``) goes first on the classpath, and the jar is then not rebuilt."""
    classes = os.environ.get("VERSIQ_CONFORMANCE_CLASSES")
    jar = JAR if classes else build()
    java = shutil.which("java") or os.path.join(os.environ.get("JAVA_HOME", ""), "bin", "java")
    path = [*([classes] if classes else []), str(jar), str(jar.parent / "lib" / "*")]
    return [java, "-cp", os.pathsep.join(path), f"dev.versiq.conformance.{main}"]


def run_operator_bench(spec: dict[str, Any], timeout: float = 3600) -> dict[str, Any]:
    """OperatorBench.java on ``spec`` (an operator scenario whose inputs name their ``files``):
    Kafka Streams' records in, seconds, records/s and output count; its summary goes to stderr."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump(spec, handle)
    try:
        out = subprocess.run([*java_command("OperatorBench"), handle.name], stdout=subprocess.PIPE, text=True,
                             check=True, timeout=timeout)
    finally:
        os.unlink(handle.name)
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def _run(main: str, scenarios: list[dict[str, Any]]) -> list[dict[str, Any]]:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump({"scenarios": scenarios}, handle)
    try:
        out = subprocess.run([*java_command(main), handle.name],
                             capture_output=True, text=True, check=True, timeout=1200)
    finally:
        os.unlink(handle.name)
    results: list[dict[str, Any]] = json.loads(out.stdout)["results"]
    return results


def kafka_loses_replaced_tombstone(sc: dict[str, Any]) -> set[str]:
    """Keys on which Kafka Streams 4.3.1 answers differently from rule 1, found by
    tests/conformance/test_kafka_stores.py (``sc``: its scenario shape, records in processing order).

    When a tombstone replaces a key's latest *value* at the same timestamp T and a record older
    than T is accepted later, Kafka's RocksDB versioned store forgets the tombstone at T: the
    older version then reads as valid up to the next version after T (or as the latest), and the
    older record's put even returns -1 ("latest"). versiq keeps the tombstone, as rule 1 says (one
    version per key and timestamp, value -> null included). Scenarios with such a key are set
    aside and counted, never compared (smallest case: value@47, tombstone@47, value@16)."""
    if sc.get("kind", "versioned") != "versioned":
        return set()
    stream_time: dict[int, int] = {}
    latest: dict[str, tuple[int, str | None]] = {}
    replaced_at: dict[str, int] = {}
    affected: set[str] = set()
    for key, value, ts in sc["records"]:
        p = partition_of(key, sc["partitions"])
        if p in stream_time and ts < stream_time[p] - sc["retention"]:
            continue  # late: changes nothing (rule 3)
        stream_time[p] = max(stream_time.get(p, ts), ts)
        current = latest.get(key)
        if value is None and current is not None and current[0] == ts and current[1] is not None:
            replaced_at[key] = ts
        if key in replaced_at and ts < replaced_at[key]:
            affected.add(key)
        if current is None or ts >= current[0]:
            latest[key] = (ts, value)
    return affected


def partition_of(key: str, partitions: int) -> int:
    """The partition (task) of a key in the store scenarios: CRC-32 of its UTF-8 bytes."""
    return zlib.crc32(key.encode()) % partitions
