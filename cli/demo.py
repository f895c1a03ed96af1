"""``versiq demo``: sample data -> ingest -> example queries -> the HTTP service in the foreground.

Every step goes through the same command line a user would type (``versiq.cli.main``), so the
demo shows nothing the CLI cannot do. The ingest runs in a child process (``run_in_child``) that
ends, with its Spark JVM, before the server starts. The answers printed beside the example curls
are read from the store after the ingest with the serving engine, so they are the ones the server
gives, also when a rerun reuses a sample and a warehouse (the ingest of files already ingested
changes nothing).
"""

from __future__ import annotations

import argparse
import json
import logging
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from versiq.cli.options import Invocation, add_logging
from versiq.cli.sample import SampleExample, SampleSummary, describe, generate, load_summary
from versiq.timestamps import format_timestamp

if TYPE_CHECKING:
    from versiq.query.api import KeyResult, VersionsPage

log = logging.getLogger(__name__)

STORE = "prices"
HISTORY_RETENTION = "7d"


@dataclass(frozen=True)
class ServedAnswers:
    """What the demo store answers for one example key, read from the store after the ingest
    (never taken from the sample's own prediction: a reused warehouse may hold other data)."""

    latest: KeyResult
    as_of: KeyResult
    versions: VersionsPage


def served_answers(warehouse: str, example: SampleExample, store: str = STORE) -> ServedAnswers | None:
    """The example's three answers from the store as ``versiq serve`` will answer them (the same
    engine, delta-rs and DuckDB: no JVM); None when the store cannot be read (nothing is promised)."""
    from versiq.query.api import MultiVersionedKeyQuery, QueryError, VersionedKeyQuery
    from versiq.query.engine import Engine

    with Engine(warehouse, refresh_interval_s=3600, watch_interval_s=3600) as engine:
        try:
            return ServedAnswers(
                latest=engine.get(store, VersionedKeyQuery(example.key)),
                as_of=engine.get(store, VersionedKeyQuery(example.key, example.as_of)),
                versions=engine.versions(store, MultiVersionedKeyQuery(example.key, example.versions_from,
                                                                       example.versions_to), limit=1000),
            )
        except QueryError as exc:
            log.warning("cannot read store %s of %s for the example answers: %s", store, warehouse, exc)
            return None


def _expect(result: KeyResult) -> str:
    record = result.record
    if result.outcome != "ok" or record is None:
        return f"expect {result.outcome}"
    valid_to = "" if record.valid_to is None else f", validTo {record.valid_to} ({format_timestamp(record.valid_to)})"
    return (f"expect price {_price(record.value)}, timestamp {record.timestamp} "
            f"({format_timestamp(record.timestamp)}){valid_to}")


def example_curls(base_url: str, example: SampleExample, answers: ServedAnswers | None,
                  store: str = STORE) -> list[tuple[str, str]]:
    """(description, curl command) for latest, as-of and versions of one example key, each with
    the answer the served store gives (none without ``answers``)."""
    key_url = f"{base_url}/v1/stores/{quote(store, safe='')}/keys/{quote(example.key, safe='')}"
    as_of = format_timestamp(example.as_of)
    start, end = format_timestamp(example.versions_from), format_timestamp(example.versions_to)
    if answers is None:
        expect = ["", "", ""]
    else:
        records = len(answers.versions.records)
        expect = [f" ({_expect(answers.latest)})", f" ({_expect(answers.as_of)})",
                  f" (expect {records} record{'' if records == 1 else 's'})"]
    return [
        (f"latest value of {example.key}{expect[0]}", f"curl -s '{key_url}'"),
        (f"{example.key} as of {as_of}{expect[1]}", f"curl -s '{key_url}?asOf={as_of}'"),
        (f"versions of {example.key} valid between {start} and {end}{expect[2]}",
         f"curl -s '{key_url}/versions?from={start}&to={end}'"),
    ]


def _price(value: Any) -> str:
    # Sample values are flat objects whose number text the API keeps: show it as the API returns it.
    text = value if isinstance(value, str) else json.dumps(value)
    marker = '"price":'
    start = text.find(marker) + len(marker)
    return text[start:text.index(",", start)].strip() if start >= len(marker) else text


def _base_url(host: str, port: int) -> str:
    if host in ("0.0.0.0", "", "::", "[::]"):
        host = "127.0.0.1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}"


def _sample(data: Path, keys: int) -> SampleSummary:
    summary = load_summary(data)
    if summary is not None:
        log.info("reusing the sample data in %s (delete it to generate a new one)", data)
        return summary
    log.info("generating a sample changelog of %d product prices in %s", keys, data)
    summary = generate(data, keys=keys)
    print(describe(summary), flush=True)
    return summary


def _rejected_hint(report_path: Path, warehouse: Path) -> str | None:
    """Where to read the records the ingest rejected (its own summary, printed by the child
    process, has the counts)."""
    try:
        report = json.loads(report_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    entry = report.get("stores", {}).get(STORE) or {}
    if not any(entry.get("rejected", {}).values()):
        return None
    return (f"rejected records are kept with their reason: versiq rejected --warehouse {warehouse} --store {STORE} "
            f"--format table, or the console's store page")


def _can_bind(host: str, port: int) -> bool:
    """Whether a server could listen on (host, port) now, bound as uvicorn binds (SO_REUSEADDR:
    a port in TIME_WAIT counts as free)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return True  # a host that does not resolve: the server's own error names it
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError:
            return False
    return True


def port_in_use(host: str, port: int, tries: int = 20) -> str | None:
    """None when the demo can serve on (host, port); else the one line that says it cannot and
    names a free port to use instead (checked before anything is generated or ingested)."""
    if _can_bind(host, port):
        return None
    free = next((p for p in range(port + 1, min(port + 1 + tries, 65536)) if _can_bind(host, p)), None)
    suggestion = (f"; port {free} is free: versiq demo --port {free} (make demo DEMO_ARGS='--port {free}')"
                  if free else "; choose another with --port")
    return f"cannot serve on {host}:{port}: the port is in use (another server?){suggestion}"


def run_in_child(argv: list[str]) -> int:
    """``versiq <argv>`` in a child process of the same interpreter, waited for: the ingest's
    Spark JVM ends with it, so the demo serves without one (~1.3 GB less while serving)."""
    sys.stdout.flush()
    sys.stderr.flush()
    return subprocess.run([sys.executable, "-m", "versiq.cli", *argv], stdin=subprocess.DEVNULL).returncode


def demo_command(args: argparse.Namespace, main: Callable[[list[str]], int],
                 child: Callable[[list[str]], int] = run_in_child) -> int:
    """Generate (once), ingest in a child process, print the console URL and example queries with
    the answers the store gives, then serve (in this process) unless ``--no-serve``."""
    from versiq.exits import EXIT_USAGE

    data = Path(args.data)
    warehouse = Path(args.warehouse)
    busy = None if args.no_serve else port_in_use(args.host, args.port)
    if busy:
        print(f"versiq demo: {busy}", file=sys.stderr)
        return EXIT_USAGE
    try:
        summary = _sample(data, args.keys)
    except ValueError as exc:
        print(f"versiq demo: {exc}", file=sys.stderr)
        return EXIT_USAGE
    logging_args = ["--log-format", args.log_format, "--log-level", args.log_level]

    with tempfile.TemporaryDirectory(prefix="versiq-demo-") as tmp:
        report = Path(tmp) / "report.json"
        status = child([
            "ingest", "--warehouse", str(warehouse), "--store", STORE, "--source", str(data),
            "--history-retention", HISTORY_RETENTION, "--report", str(report), *logging_args,
        ])
        if status != 0:
            print(f"versiq demo: the ingest failed (exit status {status})", file=sys.stderr)
            return status
        hint = _rejected_hint(report, warehouse)

    base_url = _base_url(args.host, args.port)
    example = summary.examples[0]
    answers = served_answers(str(warehouse), example)
    serve_hint = f" once served (versiq serve --warehouse {warehouse} --port {args.port})" if args.no_serve else ""
    key_page = f"{base_url}/#/stores/{quote(STORE, safe='')}/keys/{quote(example.key, safe='')}"
    lines = ["", f"Web console{serve_hint}: {base_url}/", f"  the timeline of {example.key}: {key_page}",
             f"  API docs: {base_url}/docs", "", f"Example queries against {base_url}:"]
    for description, command in example_curls(base_url, example, answers):
        lines += [f"  # {description}", f"  {command}"]
    others = ", ".join(ex.key for ex in summary.examples[1:])
    if others:
        lines.append(f"  # other keys to try: {others}")
    lines += ["  # every store with its stream time and snapshot", f"  curl -s '{base_url}/v1/stores'"]
    if hint:
        lines += ["", hint]
    print("\n".join(lines) + "\n", flush=True)
    if args.no_serve:
        return 0
    return main([
        "serve", "--warehouse", str(warehouse), "--host", args.host, "--port", str(args.port),
        *logging_args,
    ])


def _demo(inv: Invocation) -> int:
    return demo_command(inv.args, inv.main)  # the demo drives the CLI itself: passed down, never imported back


def add_demo(sub: Any) -> None:
    demo = sub.add_parser(
        "demo",
        help="generate sample data, ingest it and serve it",
        description="Generate a realistic sample changelog (product prices), ingest it into the "
        "warehouse and serve it on 127.0.0.1:8080, printing example curl queries.",
    )
    demo.add_argument("--warehouse", default="warehouse", help="warehouse directory (default ./warehouse)")
    demo.add_argument("--data", default="demo-data", help="where to write the sample changelog")
    demo.add_argument("--keys", type=int, default=5000, help="number of product keys (default 5000)")
    demo.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    demo.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    demo.add_argument("--no-serve", action="store_true", help="generate and ingest, then exit")
    add_logging(demo)
    demo.set_defaults(run=_demo)
