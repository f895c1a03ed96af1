"""What every benchmark keeps beside its figures: the machine's load, and its results file.

A results file is ``<results>/<name>-<date>[-<label>].json`` (the date of ``started``, UTC:
the run's start, or for a few benches the time they write).
When that file exists already (a second run the same day), ``-HHMM`` of the start is added, so a
run never overwrites an earlier one's figures (docs/benchmarks.md cites them by file name).
"""

from __future__ import annotations

import json
import os
import subprocess
from datetime import datetime
from typing import Any


def baseline_env(checkout: str) -> dict[str, str]:
    """The environment that runs the code of ``checkout`` (a checkout of an earlier commit, the
    baseline of a bench): its directory first on ``PYTHONPATH`` (the bench must also start it
    with ``python -P``, or outside this checkout, which would otherwise come first), with this
    checkout's jars and class archive folder: the archive maps only for the classpath it was
    written with, and its file names carry their recipe."""
    cache = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".cache")
    return {"PYTHONPATH": os.path.abspath(checkout),
            "VERSIQ_JVM_ARCHIVE_DIR": os.environ.get("VERSIQ_JVM_ARCHIVE_DIR") or os.path.join(cache, "jvm"),
            "VERSIQ_SPARK_JARS": os.environ.get("VERSIQ_SPARK_JARS") or os.path.join(cache, "jars")}


def uptime() -> str:
    """``uptime``'s line: the load averages with the time they were read."""
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def write_result(folder: str, name: str, result: Any, started: datetime, label: str = "") -> str:
    """Write ``result`` as JSON into ``folder`` (created when missing); returns the file's path."""
    os.makedirs(folder, exist_ok=True)
    stem = os.path.join(folder, f"{name}-{started.strftime('%Y-%m-%d')}{f'-{label}' if label else ''}")
    path = f"{stem}.json"
    if os.path.exists(path):
        path = f"{stem}-{started.strftime('%H%M')}.json"
    with open(path, "w") as handle:
        json.dump(result, handle, indent=2)
        handle.write("\n")
    print(f"wrote {path}")
    return path
