"""What ``versiq ingest --continuous`` on a Kafka topic costs while nothing arrives.

A real broker (the tests' ``KafkaBroker``), a topic holding one record, and continuous mode with
``--trigger-interval 1s``: once its first run has committed and ``--settle`` seconds passed, the
CPU time of the ingest's process tree (its Python process and the driver JVM, from ``/proc``)
over ``--seconds`` is the figure. With ``--baseline-checkout DIR`` the code of that checkout is
measured too, alternating, ``--rounds`` times each (``machine.baseline_env``; the bench's own
process is the load generator, idle while it measures). ``--java-client``: the topic is read with
a client setting only Java's Kafka client has (``VERSIQ_KAFKA_RECEIVE_BUFFER_BYTES``), so it is
watched by its end offsets asked through the JVM every 100 ms, not by a consumer.
``--folder-files N``: the pipeline also has a store over a local folder of N files, ingested by
the first run. The kernel watches the folder, so it is listed when it changes and every trigger
interval; beside a polled topic (``--java-client``) the loop checks every 100 ms, and the code
before this listed the folder at each check.

    .venv/bin/python bench/continuous_idle_bench.py [--seconds 30] [--baseline-checkout DIR] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from machine import baseline_env, loadavg, uptime, write_result  # noqa: E402

from tests.support.kafka_broker import KafkaBroker  # noqa: E402


def tree_cpu(root: int) -> float:
    """CPU seconds (user + system) of ``root`` and every process below it."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fields = open(f"/proc/{name}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(name)] = int(fields[1])
        times[int(name)] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def below(pid: int) -> bool:
        while pid > 1:
            if pid == root:
                return True
            pid = parents.get(pid, 0)
        return False

    return sum(t for pid, t in times.items() if below(pid))


#: A client setting with no librdkafka counterpart (``kafka.driver_config``): the Java client reads.
JAVA_ONLY_ENV = {"VERSIQ_KAFKA_RECEIVE_BUFFER_BYTES": "65536"}


def _folder(work: str, files: int) -> str:
    """A folder of ``files`` one-record JSONL files (made once per size)."""
    folder = os.path.join(work, f"folder-{files}")
    if not os.path.isdir(folder):
        os.makedirs(f"{folder}.tmp", exist_ok=True)
        for i in range(files):
            with open(os.path.join(f"{folder}.tmp", f"f{i:06d}.jsonl"), "w") as out:
                out.write(json.dumps({"key": f"k{i}", "value": i, "timestamp": i}) + "\n")
        os.rename(f"{folder}.tmp", folder)
    return folder


def idle_cpu(broker: KafkaBroker, topic: str, work: str, label: str, seconds: int, settle: int,
             checkout: str | None, java_client: bool = False, folder_files: int = 0) -> dict:
    warehouse = os.path.join(work, f"wh-{label}")
    shutil.rmtree(warehouse, ignore_errors=True)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, **(baseline_env(checkout) if checkout else {}),
           **(JAVA_ONLY_ENV if java_client else {})}
    if folder_files:
        config = os.path.join(work, f"pipeline-{label}.json")
        with open(config, "w") as out:
            json.dump({"stores": [{"name": "s", "source": {"kafka": {"bootstrap": broker.bootstrap, "topic": topic}}},
                                  {"name": "f", "source": _folder(work, folder_files)}]}, out)
        what = ["--config", config]
    else:
        what = ["--store", "s", "--kafka-bootstrap", broker.bootstrap, "--topic", topic]
    command = [sys.executable, *(["-P"] if checkout else []), "-m", "versiq.cli", "ingest", "--warehouse", warehouse,
               *what, "--continuous", "--trigger-interval", "1s"]
    ingest = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True, cwd=work)
    try:
        deadline = time.monotonic() + 300
        stores = ["s", *(["f"] if folder_files else [])]
        while not all(os.path.isdir(os.path.join(warehouse, name, "_delta_log")) for name in stores):
            if ingest.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{label}: the first run did not commit")
            time.sleep(0.2)
        time.sleep(settle)
        load = loadavg()
        before = tree_cpu(ingest.pid)
        time.sleep(seconds)
        used = tree_cpu(ingest.pid) - before
    finally:
        os.killpg(ingest.pid, signal.SIGTERM)
        ingest.wait(timeout=60)
    out = {"code": label, "seconds": seconds, "cpu_s": round(used, 2), "share_of_a_core": round(used / seconds, 4),
           "load_before": load, "load_after": loadavg()}
    print(f"{label}: {used:.2f} CPU-s in {seconds} s idle ({100 * used / seconds:.1f}% of a core; load {load})",
          flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default="/tmp/versiq-bench-idle")
    ap.add_argument("--seconds", type=int, default=30)
    ap.add_argument("--settle", type=int, default=15, help="seconds after the first commit before measuring")
    ap.add_argument("--baseline-checkout", help="a checkout of an earlier commit: its code is measured too")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--java-client", action="store_true", help="a Java-only client setting: polled, not consumed")
    ap.add_argument("--folder-files", type=int, default=0,
                    help="a second store, over a local folder of this many files")
    args = ap.parse_args()
    started = datetime.now(UTC)
    os.makedirs(args.work, exist_ok=True)
    result: dict = {"date": started.isoformat(), "machine": {"uptime_start": uptime()},
                    "baseline_checkout": args.baseline_checkout, "java_client": args.java_client,
                    "folder_files": args.folder_files, "runs": []}
    broker = KafkaBroker(work_dir=os.path.join(args.work, "kafka")).start()
    try:
        topic = broker.new_topic("idle", 1)
        broker.produce(topic, [{"key": "a", "value": "1", "timestamp_ms": 1000}])
        checkout = args.baseline_checkout and os.path.abspath(args.baseline_checkout)
        for _ in range(args.rounds):
            for label in ("this", *(["baseline"] if checkout else [])):
                result["runs"].append(idle_cpu(broker, topic, args.work, label, args.seconds, args.settle,
                                               checkout if label == "baseline" else None, args.java_client,
                                               args.folder_files))
    finally:
        broker.close()
    result["machine"]["uptime_end"] = uptime()
    write_result(os.path.join(HERE, "results"), "continuous-idle", result, started)


if __name__ == "__main__":
    main()
