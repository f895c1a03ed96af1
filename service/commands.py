"""``versiq serve``: run the HTTP API under uvicorn."""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from typing import Any

from versiq import settings, storage
from versiq.exits import EXIT_OK, EXIT_SERVE_FAILED, EXIT_USAGE
from versiq.service.http import VersiqHttpProtocol, body_timeout_s, head_timeout_s
from versiq.service.settings import ConfigError, Settings


def uvicorn_log_config(log_format: str, level: str) -> dict[str, Any]:
    """uvicorn's loggers in versiq's format (``--log-format json``: one JSON object per line)."""
    formatter: dict[str, Any]
    if log_format == "json":
        formatter = {"()": "versiq.logs.JsonFormatter"}
    else:
        formatter = {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"versiq": formatter},
        "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "versiq",
                                "stream": "ext://sys.stderr"}},
        "loggers": {
            "uvicorn": {"handlers": ["stderr"], "level": level.upper(), "propagate": False},
            "uvicorn.error": {"level": level.upper()},
            "uvicorn.access": {"handlers": ["stderr"], "level": level.upper(), "propagate": False},
            "versiq": {"handlers": ["stderr"], "level": level.upper(), "propagate": False},
        },
    }


def serve_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    settings.warn_unknown()  # once per process: a no-op after the CLI's own call
    warehouse = args.warehouse
    if not warehouse:
        print(f"versiq serve: no warehouse: pass --warehouse DIR or set {settings.WAREHOUSE.name}",
              file=sys.stderr)
        return EXIT_USAGE
    try:
        warehouse = storage.normalize(warehouse)
        # A local warehouse must exist; a bucket prefix may be empty until the first ingest (the
        # service then serves no store and becomes ready when stores appear).
        if not storage.is_s3(warehouse) and not os.path.isdir(warehouse):
            print(f"versiq serve: warehouse {warehouse!r} is not a directory", file=sys.stderr)
            return EXIT_USAGE
    except storage.StorageError as exc:
        print(f"versiq serve: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.workers < 1:
        print("versiq serve: --workers must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    # the workers read their settings from the environment they inherit
    os.environ[settings.WAREHOUSE.name] = warehouse
    # Every worker must verify the page tokens the others issued.
    os.environ.setdefault(settings.TOKEN_SECRET.name, secrets.token_hex(32))
    try:
        Settings.from_env()  # fail fast on bad configuration, before forking workers
        head_timeout_s()
        body_timeout_s()
    except ConfigError as exc:  # versiq.settings.SettingError
        print(f"versiq serve: {exc}", file=sys.stderr)
        return EXIT_USAGE

    import uvicorn

    try:
        uvicorn.run(
            "versiq.service.app:app_from_env",
            factory=True,
            host=args.host,
            port=args.port,
            workers=args.workers,
            log_config=uvicorn_log_config(args.log_format, args.log_level),
            access_log=True,
            proxy_headers=False,
            http=VersiqHttpProtocol,  # head and body timeouts, size limits, problem+json refusals (service.http)
        )
    except SystemExit as exc:  # uvicorn exits when it cannot start serving (e.g. address in use)
        if exc.code in (None, 0):
            raise
        print(f"versiq serve: could not start serving on {args.host}:{args.port} (the error is logged above)",
              file=sys.stderr)
        return EXIT_SERVE_FAILED
    return EXIT_OK
