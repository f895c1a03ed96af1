"""``make demo-kafka``: the Kafka integration end to end in one command, until Ctrl-C.

1. The broker of ``make kafka`` (scripts/local_server.py, ``start_kafka``) starts on 127.0.0.1 with
   the sample changelog of ``--sample`` (generated there first when the folder has none) in topic
   ``prices``.
2. The ingest ``make kafka`` prints runs with ``--continuous`` into a warehouse in a temporary
   folder, and ``versiq serve`` serves that warehouse on 127.0.0.1:``--port`` (default 8081): two
   child processes, each in a session of its own, their output in log files beside the warehouse
   (the ingest's run summaries, and its failed runs, are repeated here).
3. Once the server answers for the store, one more record is produced: a new price for the
   sample's example key, a minute after the store's stream time. The server is asked until it
   answers with that record; the curl and its answer are printed, with a command that produces
   another record (``demo_kafka.py produce``).
4. On Ctrl-C (or SIGTERM; also when a child ends by itself) the server, the ingest (after its
   current micro-batch) and the broker are stopped in that order, each with its process group (no
   Spark JVM stays behind), and the temporary folder is removed.

The broker is the tests' (tests/support/kafka_broker.py): scripts of the checkout may use test
support, the versiq package never does (docs/architecture.md, "Scripts and test support").
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts.local_server import ingest_argv, start_kafka  # noqa: E402
from versiq.timestamps import format_timestamp, parse_timestamp  # noqa: E402

TOPIC = "prices"
#: What the ingest adds to the command ``make kafka`` prints: runs at most every second.
CONTINUOUS = ["--continuous", "--trigger-interval", "1s"]
#: How long the ingest's first run and the round trip may take on a busy machine.
WAIT_S = 600.0
#: How long each child may take to stop after SIGTERM before it is killed.
STOP_TIMEOUT_S = {"serve": 20.0, "ingest": 60.0}


class Stopped(Exception):
    """Ctrl-C (or SIGTERM) arrived while waiting."""


class ChildFailed(Exception):
    """A child process ended by itself."""


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when this process goes (PR_SET_PDEATHSIG), even SIGKILLed."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)


class Child:
    """A ``versiq`` command in a session of its own, its output in ``log`` (lines that ``echo``
    accepts also printed here, after ``prefix``)."""

    def __init__(self, name: str, argv: list[str], log: Path, env: dict[str, str],
                 echo: Callable[[str], bool] = lambda line: False) -> None:
        self.name, self.log = name, log
        self._log: IO[bytes] = open(log, "wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "versiq.cli", *argv[1:]], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True, preexec_fn=_die_with_parent)
        self._relay = threading.Thread(target=self._copy, args=(echo,), daemon=True)
        self._relay.start()

    def _copy(self, echo: Callable[[str], bool]) -> None:
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            self._log.write(raw)
            self._log.flush()
            line = raw.decode("utf-8", "replace").rstrip()
            if echo(line):
                print(f"  [{self.name}] {line}", flush=True)

    def check(self) -> None:
        """``ChildFailed`` with the log's tail when the process has ended."""
        code = self.process.poll()
        if code is not None:
            self._relay.join(5)
            raise ChildFailed(f"{self.name} ended by itself (exit status {code}); the last lines of {self.log}:\n"
                              + self.tail())

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` s; then SIGKILL whatever is left of its process
        group (a JVM it started)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                print(f"{self.name} did not stop within {timeout:g} s: killed", flush=True)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)
        self._relay.join(10)
        self._log.close()


def _can_bind(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def produce_one(bootstrap: str, topic: str, key: str, value: str | None, timestamp_ms: int) -> tuple[int, int]:
    """Produce one record (``value`` JSON text, None a tombstone) and wait for it: (partition, offset)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"})
    delivered: list[Any] = []
    producer.produce(topic, key=key.encode(), value=None if value is None else value.encode(),
                     timestamp=timestamp_ms, on_delivery=lambda err, msg: delivered.append(err or msg))
    producer.flush(30)
    if not delivered or not hasattr(delivered[0], "offset"):
        raise RuntimeError(f"producing to {topic} on {bootstrap} failed: {delivered[0] if delivered else 'timeout'}")
    return delivered[0].partition(), delivered[0].offset()


def _new_value(before: Any) -> dict[str, Any]:
    """A new value for the example key: its price 10% up, its other fields kept."""
    if isinstance(before, dict) and isinstance(before.get("price"), int | float):
        return {**before, "price": round(before["price"] * 1.1, 2)}
    return {"price": 9.99, "currency": "EUR", "stock": 1}


class Demo:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.stopping = threading.Event()
        self.base_url = f"http://127.0.0.1:{args.port}"
        self.children: list[Child] = []

    def wait(self, what: str, ready: Callable[[], Any], timeout: float = WAIT_S, every: float = 0.25) -> Any:
        """``ready()``'s first true answer; ``Stopped`` on a signal, ``ChildFailed`` when a child
        ends, ``TimeoutError`` after ``timeout`` s."""
        import httpx

        deadline = time.monotonic() + timeout
        while True:
            if self.stopping.is_set():
                raise Stopped
            for child in self.children:
                child.check()
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):  # not (fully) up yet
                answer = ready()
                if answer:
                    return answer
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} took more than {timeout:g} s")
            self.stopping.wait(every)

    def run(self, work: Path) -> None:
        import httpx

        args = self.args
        broker = start_kafka(TOPIC, sample=Path(args.sample), keys=args.keys, new_session=True)
        try:
            if self.stopping.is_set():
                raise Stopped
            from versiq.cli.sample import load_summary

            summary = load_summary(args.sample)
            key = summary.examples[0].key if summary is not None and summary.examples else "sku-00001"
            warehouse = work / "warehouse"
            warehouse.mkdir()
            env = {**os.environ, "VERSIQ_CACHE_DIR": str(work / "index-cache")}
            env.setdefault("PYSPARK_PYTHON", sys.executable)
            ingest = [*ingest_argv(broker.bootstrap, TOPIC, str(warehouse)), *CONTINUOUS]
            serve = ["versiq", "serve", "--warehouse", str(warehouse), "--port", str(args.port)]
            print(f"\nStarted, with their logs in {work}:\n  {shlex.join(ingest)}\n  {shlex.join(serve)}\n"
                  "waiting for the ingest's first run (Spark starts first: about half a minute) ...", flush=True)
            began = time.monotonic()
            self.children.append(Child("ingest", ingest, work / "ingest.log", env,
                                       echo=lambda line: line.startswith((f"store {TOPIC}: read ",
                                                                          f"store {TOPIC}: FAILED"))))
            self.children.append(Child("serve", serve, work / "serve.log", env))

            def served() -> bool:
                state = httpx.get(f"{self.base_url}/readyz", timeout=5).json()
                return state.get("stores", {}).get(TOPIC, {}).get("snapshot") is not None

            self.wait("serving the store", served)
            print(f"store {TOPIC} served on {self.base_url} ({time.monotonic() - began:.0f} s after the start)",
                  flush=True)
            self.round_trip(broker.bootstrap, key)
            while True:  # until Ctrl-C, or a child that ends by itself
                self.wait("Ctrl-C", lambda: False, timeout=float("inf"), every=1.0)
        finally:
            self.stop(broker)

    def round_trip(self, bootstrap: str, key: str) -> None:
        import httpx

        store_url = f"{self.base_url}/v1/stores/{quote(TOPIC, safe='')}"
        key_url = f"{store_url}/keys/{quote(key, safe='')}"
        stream_time = int(httpx.get(store_url, timeout=10).json()["streamTime"])
        before = httpx.get(key_url, timeout=10)
        value = _new_value(before.json().get("value") if before.status_code == 200 else None)
        timestamp = stream_time + 60_000
        record = {"key": key, "value": value, "timestamp": timestamp}
        partition, offset = produce_one(bootstrap, TOPIC, key, json.dumps(value), timestamp)
        sent = time.monotonic()
        print(f"\nRound trip: produced to topic {TOPIC} (partition {partition}, offset {offset}), stamped "
              f"{format_timestamp(timestamp)}, a minute after the store's stream time:\n  {json.dumps(record)}",
              flush=True)

        def answered() -> str | None:
            response = httpx.get(key_url, timeout=10)
            return response.text if response.status_code == 200 and response.json()["timestamp"] == timestamp else None

        answer = self.wait("the answer to the produced record", answered)
        later = json.loads(answer)
        value_before = f"; before it: {before.text}" if before.status_code == 200 else ""
        command = (f"{shlex.quote(os.path.relpath(sys.executable))} scripts/demo_kafka.py produce --bootstrap "
                   f"{bootstrap} {shlex.quote(key)} {shlex.quote(json.dumps(_new_value(value)))} "
                   f"--timestamp {format_timestamp(timestamp + 60_000)}")
        print(f"served {time.monotonic() - sent:.1f} s later, at snapshot {later['snapshot']}{value_before}:\n"
              f"  curl -s '{key_url}'\n  {answer}\n\n"
              f"Web console: {self.base_url}/  (the timeline of {key}: {self.base_url}/#/stores/{TOPIC}/keys/"
              f"{quote(key, safe='')})\n"
              f"Produce another record, then run the curl again (a moment later):\n  {command}\n"
              "Ctrl-C here stops the server, the ingest and the broker and removes their data.", flush=True)

    def stop(self, broker: Any) -> None:
        for child in reversed(self.children):  # the server, then the ingest (its current micro-batch first)
            child.stop(STOP_TIMEOUT_S[child.name])
        broker.close()
        stopped = [{"serve": "the server", "ingest": "the ingest"}[c.name] for c in reversed(self.children)]
        print(f"stopped {', '.join([*stopped, 'the broker'])}; removed the broker's data", flush=True)


def demo(args: argparse.Namespace) -> int:
    if not _can_bind(args.port):
        print(f"demo_kafka: cannot serve on 127.0.0.1:{args.port}: the port is in use (another server?); "
              "choose another with --port (make demo-kafka DEMO_KAFKA_ARGS='--port N')", file=sys.stderr)
        return 2
    demo = Demo(args)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: demo.stopping.set())
    work = Path(tempfile.mkdtemp(prefix="versiq-demo-kafka-"))
    status = 0
    try:
        demo.run(work)
    except Stopped:
        pass
    except (ChildFailed, TimeoutError, RuntimeError) as exc:  # RuntimeError: the broker's (KafkaBrokerError)
        print(f"demo_kafka: {exc}", file=sys.stderr, flush=True)
        status = 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
        print(f"removed {work} (warehouse, logs)", flush=True)
    return status


def produce(args: argparse.Namespace) -> int:
    value = None if args.value == "null" else json.dumps(json.loads(args.value))
    timestamp = int(time.time() * 1000) if args.timestamp is None else parse_timestamp(args.timestamp)
    partition, offset = produce_one(args.bootstrap, args.topic, args.key, value, timestamp)
    print(f"produced {args.key} at {format_timestamp(timestamp)} to {args.topic} (partition {partition}, "
          f"offset {offset})")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--sample", default="demo-data", metavar="DIR",
                        help="the sample changelog to produce (generated there when DIR has none)")
    parser.add_argument("--keys", type=int, default=5000, help="product keys of a sample generated (default 5000)")
    parser.add_argument("--port", type=int, default=8081, help="the server's port on 127.0.0.1 (default 8081)")
    sub = parser.add_subparsers(dest="command")
    p = sub.add_parser("produce", help="produce one record (to the demo's broker)")
    p.add_argument("--bootstrap", required=True, metavar="HOST:PORT")
    p.add_argument("--topic", default=TOPIC)
    p.add_argument("key")
    p.add_argument("value", help="JSON text; null: a tombstone")
    p.add_argument("--timestamp", default=None, help="RFC 3339 or epoch ms (default now)")
    args = parser.parse_args(argv)
    return produce(args) if args.command == "produce" else demo(args)


if __name__ == "__main__":
    sys.exit(main())
