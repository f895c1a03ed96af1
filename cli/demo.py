"""``versiq demo``: sample data -> ingest -> example queries -> the HTTP service in the foreground.

Every step goes through the same command line a user would type (``versiq.cli.main``), so the
demo shows nothing the CLI cannot do. Rerunning it reuses the sample data and the warehouse: the
ingest of files already ingested changes nothing.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

from versiq.cli.sample import SampleExample, SampleSummary, describe, generate, load_summary
from versiq.timestamps import format_timestamp

log = logging.getLogger(__name__)

STORE = "prices"
HISTORY_RETENTION = "7d"


def example_curls(base_url: str, example: SampleExample, store: str = STORE) -> list[tuple[str, str]]:
    """(description, curl command) for latest, as-of and versions of one example key."""
    key_url = f"{base_url}/v1/stores/{quote(store, safe='')}/keys/{quote(example.key, safe='')}"
    as_of = format_timestamp(example.as_of)
    start, end = format_timestamp(example.versions_from), format_timestamp(example.versions_to)
    return [
        (
            f"latest value of {example.key} (expect price {_price(example.latest.value)}, "
            f"timestamp {example.latest.timestamp})",
            f"curl -s '{key_url}'",
        ),
        (
            f"{example.key} as of {as_of} (expect price {_price(example.as_of_answer.value)}, "
            f"validTo {example.as_of_answer.valid_to})",
            f"curl -s '{key_url}?asOf={as_of}'",
        ),
        (
            f"versions of {example.key} valid between {start} and {end} "
            f"(expect {len(example.versions)} records)",
            f"curl -s '{key_url}/versions?from={start}&to={end}'",
        ),
    ]


def _price(value_text: str) -> str:
    # Sample values are flat objects; show the number text as the API returns it.
    marker = '"price":'
    start = value_text.find(marker) + len(marker)
    return value_text[start:value_text.index(",", start)]


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


def _report_line(report_path: Path, warehouse: Path) -> str:
    try:
        report = json.loads(report_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "ingest finished (no report written)"
    entry = report.get("stores", {}).get(STORE)
    if entry is None:
        return f"store {STORE!r} is up to date: nothing new to ingest"
    rejected = ", ".join(f"{k} {v}" for k, v in entry.get("rejected", {}).items() if v) or "none"
    return (
        f"ingested {entry.get('read')} records into store {STORE!r}: "
        f"{entry.get('accepted_latest')} latest, {entry.get('accepted_out_of_order')} out-of-order, "
        f"rejected: {rejected} (list them with: versiq rejected --warehouse {warehouse} --store {STORE})"
    )


def demo_command(args: argparse.Namespace, main: Callable[[list[str]], int]) -> int:
    """Generate (once), ingest, print example queries, then serve unless ``--no-serve``."""
    from versiq.exits import EXIT_USAGE

    data = Path(args.data)
    warehouse = Path(args.warehouse)
    try:
        summary = _sample(data, args.keys)
    except ValueError as exc:
        print(f"versiq demo: {exc}", file=sys.stderr)
        return EXIT_USAGE
    logging_args = ["--log-format", args.log_format, "--log-level", args.log_level]

    with tempfile.TemporaryDirectory(prefix="versiq-demo-") as tmp:
        report = Path(tmp) / "report.json"
        status = main([
            "ingest", "--warehouse", str(warehouse), "--store", STORE, "--source", str(data),
            "--history-retention", HISTORY_RETENTION, "--report", str(report), *logging_args,
        ])
        if status != 0:
            print(f"versiq demo: the ingest failed (exit status {status})", file=sys.stderr)
            return status
        print(_report_line(report, warehouse), flush=True)

    base_url = _base_url(args.host, args.port)
    lines = ["", "Example queries" + (" (start the server with: versiq serve --warehouse "
                                       f"{warehouse})" if args.no_serve else f" against {base_url}:")]
    for example in summary.examples[:1]:
        for description, command in example_curls(base_url, example):
            lines += [f"  # {description}", f"  {command}"]
    others = ", ".join(ex.key for ex in summary.examples[1:])
    if others:
        lines.append(f"  # other keys to try: {others}")
    lines += ["  # every store with its stream time and snapshot", f"  curl -s '{base_url}/v1/stores'"]
    print("\n".join(lines) + "\n", flush=True)
    if args.no_serve:
        return 0
    return main([
        "serve", "--warehouse", str(warehouse), "--host", args.host, "--port", str(args.port),
        *logging_args,
    ])
