"""What several commands of the ``versiq`` command line share: the warehouse, snapshot and
logging options, and what a command's ``run`` is handed (``Invocation``).

Every command module of this package declares its own arguments (``add_<command>(sub)``, which
also sets the parser's ``run``) next to the function that runs it; the work itself lives in the
packages below (``versiq.ingest``, ``versiq.service``, ``versiq.query``), imported only when the
command runs, so that building the parser stays cheap."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from dataclasses import dataclass

from versiq import settings, storage

#: Where every command's --warehouse help says a warehouse may live.
WAREHOUSE_HELP = ("warehouse: a directory, or s3://bucket/prefix (endpoint, region and credentials from the "
                  "standard AWS_* variables) (env VERSIQ_WAREHOUSE)")


@dataclass(frozen=True)
class Invocation:
    """A command's run: its arguments, the parser (for its errors), the words it was given (a
    resident driver runs them again) and the command line itself (the demo drives it)."""

    args: argparse.Namespace
    parser: argparse.ArgumentParser
    argv: list[str]
    main: Callable[[list[str]], int]


@dataclass(frozen=True)
class Deferred:
    """A command's ``run`` that calls ``module.function(args)``, importing the module only then
    (building the parser must not load the ingest, the engine or Spark)."""

    module: str
    function: str

    def target(self) -> Callable[[argparse.Namespace], int]:
        target: Callable[[argparse.Namespace], int] = getattr(importlib.import_module(self.module), self.function)
        return target

    def __call__(self, inv: Invocation) -> int:
        return self.target()(inv.args)


def runs(module: str, function: str) -> Deferred:
    """``Deferred(module, function)``: what ``set_defaults(run=...)`` takes."""
    return Deferred(module, function)


def warehouse_location(text: str) -> str:
    """A --warehouse value in its canonical form (``versiq.storage.normalize``)."""
    try:
        return storage.normalize(text)
    except storage.StorageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_snapshot_options(parser: argparse.ArgumentParser) -> None:
    """Which snapshot answers: ``--snapshot`` or ``--as-of-system-time``."""
    parser.add_argument("--snapshot", type=int, default=None, help="answer from this Delta version of the store")
    parser.add_argument("--as-of-system-time", default=None, metavar="T",
                        help="answer from the snapshot current at T (epoch ms or RFC 3339; not with --snapshot)")


def add_read_options(parser: argparse.ArgumentParser) -> None:
    """Which snapshot answers (``add_snapshot_options``) and ``--iso``."""
    add_snapshot_options(parser)
    parser.add_argument("--iso", action="store_true", help="print times as RFC 3339 (UTC) instead of epoch ms")


def add_warehouse(parser: argparse.ArgumentParser, default: str | None = None) -> None:
    """--warehouse, defaulting to VERSIQ_WAREHOUSE (then ``default``); required when neither is set."""
    value = settings.WAREHOUSE.value() or default
    parser.add_argument("--warehouse", default=value, required=value is None, type=warehouse_location,
                        help=WAREHOUSE_HELP)


def add_logging(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--log-format",
        choices=("text", "json"),
        default=settings.LOG_FORMAT.value(),
        help="log format on stderr: human-readable text (default) or one JSON object per line "
        "(for services; env VERSIQ_LOG_FORMAT)",
    )
    parser.add_argument(
        "--log-level",
        default=settings.LOG_LEVEL.value(),
        help="log level (DEBUG, INFO, WARNING, ERROR; env VERSIQ_LOG_LEVEL)",
    )
