"""The ``versiq`` command line: the commands' parsers, each declared by its own module of this
package (``ingest``, ``serve``, ``stores``, ``reads``, ``demo``, ``sample``), and the process's
entry point.

The flags and exit codes are a contract other tools drive (docs/contract.md, docs/cli.md): add,
never rename. Exit status: 0 success, 1 a store failed, 2 usage or configuration error.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from versiq import __version__, settings
from versiq.cli import demo, ingest, reads, sample, serve, stores
from versiq.cli.options import Invocation
from versiq.exits import EXIT_USAGE
from versiq.logs import setup_logging


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command, each declared by its own module; a command's parser names the
    function that runs it (``run``)."""
    parser = argparse.ArgumentParser(
        prog="versiq",
        description="Versioned state stores with Kafka Streams semantics: ingest changelogs "
        "into Delta Lake with Spark, query them over HTTP.",
    )
    parser.add_argument("--version", action="version", version=f"versiq {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in COMMANDS:
        add(sub)
    return parser


#: Every command, in the order ``--help`` lists them.
COMMANDS: tuple[Callable[[Any], None], ...] = (
    ingest.add_ingest, ingest.add_driver, serve.add_serve, stores.add_maintain, stores.add_erase,
    stores.add_drop, stores.add_rebuild, reads.add_rejected, reads.add_keys, reads.add_get, reads.add_lookup,
    reads.add_sql, reads.add_history, demo.add_demo, sample.add_generate,
)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        parser = build_parser()  # option defaults come from VERSIQ_* variables
    except settings.SettingError as exc:
        print(f"versiq: {exc}", file=sys.stderr)
        return EXIT_USAGE
    words = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(words)
    setup_logging(args.log_format, args.log_level)
    settings.warn_unknown()
    status: int = args.run(Invocation(args, parser, words, main))
    return status


def run() -> None:  # pragma: no cover - the process entry point
    """``versiq`` as a process: run ``main``, flush everything, then end the process without
    interpreter teardown. Native thread pools (delta-rs' runtime, Arrow's, DuckDB's) can abort
    while the interpreter tears down ("terminate called without an active exception", exit
    -6) after all work and output are done; seen once under heavy load with ``versiq
    rejected``. The exit status must be the command's, so teardown is skipped."""
    import logging

    code = main()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        logging.shutdown()
        os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    run()
