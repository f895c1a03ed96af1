"""``versiq ingest`` through the CLI, a process per run (issue 17: small runs are cheap), with the
driver JVM's JIT and Spark's code generation as the variables and the full JIT with generated
code (what every run did before) as the baseline of the same run.

A one-shot run's JVM compiles with C1 only (``ingest.spark.SHORT_LIVED_JIT_OPTION``) and a small
one evaluates expressions interpreted (``ingest.spark.plans_for_input``); ``c1_codegen`` turns
the second off, ``full_jit`` both (``-XX:TieredStopAtLevel=4`` in ``VERSIQ_DRIVER_JAVA_OPTIONS``,
which comes last). All map the class-data-sharing archive ``make`` writes. ``driver`` is the
same CLI with a resident driver listening (``versiq driver``, ``ingest.driver``, started by this
bench with its warm-up runs; the seconds until it is ready are reported apart): every run is the
driver's, no JVM starts. ``autostart`` is the CLI with ``VERSIQ_DRIVER_AUTOSTART``: its first
run (of the bench) runs in its own JVM and starts a driver in the background, which the later
runs find (without warm-up runs: the first of them compile as they go). ``no_archive`` is
``c1`` without the class-data-sharing archive (``VERSIQ_JVM_ARCHIVE_DIR`` an empty folder),
``spark_parses`` ``c1`` with every run parsed and decided by Spark (``VERSIQ_PARSE_HERE_BYTES=0``,
no parse in the driver, no DuckDB decisions): each measures one speed piece on the user's
paths (docs/benchmarks.md, "What each speed piece gains"). ``no_crc`` is ``c1``
on tables whose newest commit has no Delta checksum file (the bench deletes them before each of
its runs), as versiq wrote them before it kept Delta's default of writing one. ``previous`` is
``c1`` run by the code of an earlier commit (``--baseline-checkout DIR``, e.g. ``git worktree
add DIR HEAD~1``: that directory first on ``PYTHONPATH``, this checkout's jars and class archive
folder, ``.cache/jars`` and ``.cache/jvm``: the archive maps only for the classpath it was
written with, and its file names carry their recipe). Runs alternate
between the settings so that the machine's load falls on all alike; ``--settings`` picks some
(the first is the baseline of the ratios).

- **one record**: a one-line JSONL file into a small store (``--repeat`` runs each);
- **10k into 2M**: a 10,000-event batch (``gen_changelog.make_events``, random existing keys)
  into a store of 200,000 keys x 10 versions (built once by the CLI, not timed), ``--repeat``
  runs each; the store grows by a batch per run;
- **1M new store**: 1,000,000 events (100,000 keys x 10, 8 JSONL files) into a new store,
  ``--repeat-1m`` runs each (default 1), alternating, each into a new warehouse.

The load generator is this process starting ``versiq ingest`` one at a time (``subprocess``); wall
time per process is the figure. The machine's load average is recorded before and after.

    .venv/bin/python bench/cli_bench.py [--repeat 3] [--skip-1m | --repeat-1m 3] [--settings c1,driver]
        [--results bench/results]
        [--baseline-checkout DIR --settings previous,c1] [--skip-small]
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import gen_changelog as gen  # noqa: E402
from machine import baseline_env, write_result  # noqa: E402

#: The settings (environment of the ``versiq ingest`` process): the one-shot default (C1, and
#: interpreted expressions for a small run), C1 with generated code (``VERSIQ_INTERPRETED_RUN_BYTES``
#: 0), and the full JIT with generated code (the baseline: what every run did before).
SETTINGS: dict[str, dict[str, str]] = {
    "c1": {},
    "c1_codegen": {"VERSIQ_INTERPRETED_RUN_BYTES": "0"},
    "full_jit": {"VERSIQ_DRIVER_JAVA_OPTIONS": "-XX:TieredStopAtLevel=4", "VERSIQ_INTERPRETED_RUN_BYTES": "0"},
    # the same CLI, its tables' newest commits without Delta's checksum file: this bench deletes
    # every ``_delta_log/*.crc`` before each of its runs (what a store written by versiq before
    # 2026-11-26 night has: Delta then rebuilds the state of the read snapshot in the commit)
    "no_crc": {},
    # the CLI of an earlier commit (``--baseline-checkout DIR``: its directory first on
    # PYTHONPATH, the same class archive folder); set in main()
    "previous": {},
    # the same CLI with VERSIQ_DRIVER_AUTOSTART: its first run starts a driver in the background
    # (docs/cli.md, "Started by the CLI"), the runs after it are that driver's; set in main()
    "autostart": {},
    # the same CLI, its runs made by a resident driver (``versiq driver``, started by this bench,
    # warm-up included; its start is reported apart): VERSIQ_DRIVER_SOCKET is set in main()
    "driver": {},
    # the CLI without the class-data-sharing archive (VERSIQ_JVM_ARCHIVE_DIR, an empty folder):
    # what the archive gains on each path; set in main()
    "no_archive": {},
    # the CLI with every run parsed by Spark tasks and decided by Spark (VERSIQ_PARSE_HERE_BYTES=0):
    # what parsing in the driver and deciding with DuckDB gain
    "spark_parses": {"VERSIQ_PARSE_HERE_BYTES": "0"},
}
#: Extra environment of the resident driver (and its clients) per driver setting.
DRIVER_SETTINGS: dict[str, dict[str, str]] = {"driver": {}}
#: ``-P``: the package comes from ``PYTHONPATH`` or the installed one, never from the working
#: directory (which would shadow a ``previous`` checkout when the bench runs from a checkout).
VERSIQ = [sys.executable, "-P", "-m", "versiq.cli", "ingest"]
#: The environment of every process this bench starts (a driver's must equal its clients').
BASE_ENV = {**os.environ, "PYSPARK_PYTHON": sys.executable, "VERSIQ_DRIVER_SOCKET": "off"}


def start_driver(work: str, name: str = "driver") -> tuple[subprocess.Popen[str], float]:
    """``versiq driver`` of setting ``name`` (``DRIVER_SETTINGS``) on a socket in ``work``;
    returns it and the seconds until it was ready (session, warm-up runs)."""
    socket_file = os.path.join(work, f"{name}.sock")
    extra = DRIVER_SETTINGS[name]
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "versiq.cli", "driver", "--socket", socket_file],
                            env={**{k: v for k, v in BASE_ENV.items() if k != "VERSIQ_DRIVER_SOCKET"}, **extra},
                            stdout=subprocess.PIPE, stderr=open(os.path.join(work, f"{name}.log"), "w"),  # noqa: SIM115
                            stdin=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    if "ready on" not in proc.stdout.readline():
        raise SystemExit(f"versiq driver did not start; see {work}/{name}.log")
    SETTINGS[name] = {"VERSIQ_DRIVER_SOCKET": socket_file, **extra}
    return proc, time.monotonic() - started


#: Drivers the ``autostart`` runs started (pids), stopped at the end.
AUTOSTARTED: list[int] = []
STARTED = re.compile(r"started a resident driver \(pid (\d+)\)")


def _ingest(warehouse: str, source: str, setting: dict[str, str]) -> float:
    env = {**BASE_ENV, **setting}
    started = time.monotonic()
    done = subprocess.run([*VERSIQ, "--warehouse", warehouse, "--store", "s", "--source", source,
                           "--max-future", "none"], env=env, capture_output=True, text=True)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"versiq ingest failed ({done.returncode}):\n{done.stderr[-3000:]}")
    AUTOSTARTED.extend(int(pid) for pid in STARTED.findall(done.stderr))
    return seconds


#: The settings whose runs find no Delta checksum files (``SETTINGS``).
WITHOUT_CHECKSUMS = frozenset({"no_crc"})


def drop_checksums(warehouse: str) -> None:
    """Delete the ``.crc`` files of every table's Delta log under ``warehouse``."""
    for crc in glob.glob(os.path.join(warehouse, "**", "_delta_log", "*.crc"), recursive=True):
        os.remove(crc)


def _alternate(what: str, repeat: int, warehouse: str, source: str,
               land: Callable[[int], None]) -> dict[str, list[float]]:
    """``repeat`` rounds of one run per setting; before each run ``land(n)`` (n = 1, 2, ...) adds
    its new input to ``source``."""
    times: dict[str, list[float]] = {name: [] for name in SETTINGS}
    n = 0
    for _ in range(repeat):
        for name, setting in SETTINGS.items():
            n += 1
            land(n)
            if name in WITHOUT_CHECKSUMS:
                drop_checksums(warehouse)
            times[name].append(_ingest(warehouse, source, setting))
            print(f"{what}, {name}: {times[name][-1]:.1f} s", flush=True)
    return times


def one_record(work: str, repeat: int) -> dict[str, list[float]]:
    source, warehouse = os.path.join(work, "one-src"), os.path.join(work, "one-wh")
    os.makedirs(source)
    with open(os.path.join(source, "0000.jsonl"), "w") as f:
        f.writelines(json.dumps({"key": f"k{i}", "value": i, "timestamp": 1_000 + i}) + "\n" for i in range(100))
    _ingest(warehouse, source, {})

    def land(n: int) -> None:
        with open(os.path.join(source, f"{n:04d}.jsonl"), "w") as f:
            f.write(json.dumps({"key": f"k{n % 100}", "value": n, "timestamp": 10_000 + n}) + "\n")

    return _alternate("one record", repeat, warehouse, source, land)


def batch_into_store(work: str, repeat: int, keys: int) -> dict[str, list[float]]:
    folder, warehouse = os.path.join(work, "big-src"), os.path.join(work, "big-wh")
    source = os.path.join(folder, "jsonl")  # where write_changelog puts JSONL files
    gen.write_changelog(gen.make_events(keys, 10, seed=42), folder, "jsonl", 8)
    print(f"building the {keys * 10:,}-version store (not timed)", flush=True)
    _ingest(warehouse, source, {})

    def land(n: int) -> None:
        after = keys * 10 + (n - 1) * 10_000
        batch = gen.make_events(keys, 10, seed=42, batch=10_000, after_events=after)
        gen.write_changelog(batch, folder, "jsonl", 1, prefix=f"x-batch-{after:010d}")

    return _alternate(f"10k into {keys * 10:,}", repeat, warehouse, source, land)


def new_store(work: str, repeat: int) -> dict[str, list[float]]:
    gen.write_changelog(gen.make_events(100_000, 10, seed=7), os.path.join(work, "m-src"), "jsonl", 8)
    source = os.path.join(work, "m-src", "jsonl")
    times: dict[str, list[float]] = {}
    for n in range(repeat):
        for name, options in SETTINGS.items():
            if name in WITHOUT_CHECKSUMS:  # a new store: no earlier commit, nothing to compare
                continue
            warehouse = os.path.join(work, f"m-wh-{name}-{n}")
            times.setdefault(name, []).append(_ingest(warehouse, source, options))
            shutil.rmtree(warehouse, ignore_errors=True)
            print(f"1M new store, {name}: {times[name][-1]:.1f} s", flush=True)
    return times


def _summary(times: dict[str, list[float]], baseline: str) -> dict[str, object]:
    median = {name: round(statistics.median(values), 2) for name, values in times.items()}
    return {"seconds": {name: [round(v, 2) for v in values] for name, values in times.items()},
            "median_s": median,
            f"over_{baseline}": {name: round(median[name] / median[baseline], 3) for name in median}
            if baseline in median else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--keys", type=int, default=200_000, help="keys of the store the 10k batches go into (x 10)")
    ap.add_argument("--skip-1m", action="store_true")
    ap.add_argument("--skip-small", action="store_true", help="skip the one-record and 10k paths")
    ap.add_argument("--repeat-1m", type=int, default=1, help="runs of each setting building the 1M-event store")
    ap.add_argument("--settings", default=",".join(SETTINGS),
                    help=f"comma-separated settings to compare (default all: {', '.join(SETTINGS)}); the first "
                         "is the baseline of the ratios")
    ap.add_argument("--results", default=os.path.join(HERE, "results"))
    ap.add_argument("--baseline-checkout", help="a checkout of an earlier commit: setting 'previous' runs its code")
    args = ap.parse_args()
    chosen = args.settings.split(",")
    if "previous" in chosen:
        if not args.baseline_checkout or not os.path.isdir(os.path.join(args.baseline_checkout, "versiq")):
            ap.error("setting 'previous' needs --baseline-checkout DIR, a checkout of versiq")
        SETTINGS["previous"] = baseline_env(args.baseline_checkout)
    for name in set(SETTINGS) - set(chosen):
        del SETTINGS[name]
    work = tempfile.mkdtemp(prefix="versiq-cli-bench-")
    load_before = os.getloadavg()
    drivers: list[subprocess.Popen[str]] = []
    try:
        result: dict[str, object] = {
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "load_generator": "this process, one `versiq ingest` subprocess at a time",
            "baseline": f"{chosen[0]}: the same runs, alternating",
            "baseline_checkout": args.baseline_checkout and os.path.abspath(args.baseline_checkout),
        }
        if "autostart" in SETTINGS:
            SETTINGS["autostart"] = {"VERSIQ_DRIVER_SOCKET": os.path.join(work, "auto", "driver.sock"),
                                     "VERSIQ_DRIVER_AUTOSTART": "10m"}
        if "no_archive" in SETTINGS:
            os.makedirs(os.path.join(work, "no-archive"))
            SETTINGS["no_archive"] = {"VERSIQ_JVM_ARCHIVE_DIR": os.path.join(work, "no-archive")}
        for name in [name for name in DRIVER_SETTINGS if name in SETTINGS]:
            driver, result[f"{name}_ready_s"] = start_driver(work, name)
            drivers.append(driver)
            print(f"resident driver ({name}) ready after {result[f'{name}_ready_s']:.1f} s", flush=True)
        if not args.skip_small:
            result |= {
                "one_record": _summary(one_record(work, args.repeat), chosen[0]),
                f"10k_into_{args.keys * 10}": _summary(batch_into_store(work, args.repeat, args.keys), chosen[0]),
            }
        if not args.skip_1m:
            result["1m_new_store"] = _summary(new_store(work, args.repeat_1m), chosen[0])
        result["load_before"], result["load_after"] = load_before, os.getloadavg()
    finally:
        for driver in drivers:
            driver.terminate()
            driver.wait(timeout=120)
        for pid in AUTOSTARTED:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        result["autostarted_drivers"] = len(AUTOSTARTED)
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result, indent=2))
    write_result(args.results, "cli", result, datetime.now(UTC))


if __name__ == "__main__":
    main()
