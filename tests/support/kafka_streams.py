"""The Kafka Streams side of the differential tests (issue 13): builds and runs the Java harness in
conformance/kafka/ (Kafka Streams and its TopologyTestDriver, the version pinned in its pom.xml),
many scenarios per JVM start.

``make test`` builds the harness first (``make conformance-jar``); run alone, the tests build it
here with Maven, caching artifacts under ``.cache/m2`` (git-ignored).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ROOT / "conformance" / "kafka"
JAR = HARNESS / "target" / "versiq-conformance-1.jar"
KAFKA_VERSION = "4.3.1"


def build() -> Path:
    """The harness jar, built with Maven when missing or older than its sources."""
    sources = [HARNESS / "pom.xml", *HARNESS.glob("src/**/*.java")]
    if JAR.exists() and all(JAR.stat().st_mtime >= s.stat().st_mtime for s in sources):
        return JAR
    mvn = shutil.which("mvn")
    if mvn is None:
        raise RuntimeError("Maven (mvn) is needed to build conformance/kafka: apt-get install maven")
    subprocess.run([mvn, "-q", "-B", f"-Dmaven.repo.local={ROOT / '.cache' / 'm2'}", "-f", str(HARNESS / "pom.xml"),
                    "package", "-DskipTests"], check=True, timeout=1200)
    return JAR


def run_store_scenarios(scenarios: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Kafka's answers for ``scenarios`` (the input format of StoreScenarios.java), in order."""
    return _run("StoreScenarios", scenarios)


def run_operator_scenarios(scenarios: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What Kafka emits for ``scenarios`` (the input format of OperatorScenarios.java), in order."""
    return _run("OperatorScenarios", scenarios)


def _run(main: str, scenarios: list[dict[str, Any]]) -> list[dict[str, Any]]:
    jar = build()
    java = shutil.which("java") or os.path.join(os.environ.get("JAVA_HOME", ""), "bin", "java")
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump({"scenarios": scenarios}, handle)
    try:
        out = subprocess.run([java, "-cp", f"{jar}{os.pathsep}{jar.parent / 'lib' / '*'}",
                              f"dev.versiq.conformance.{main}", handle.name],
                             capture_output=True, text=True, check=True, timeout=1200)
    finally:
        os.unlink(handle.name)
    results: list[dict[str, Any]] = json.loads(out.stdout)["results"]
    return results
