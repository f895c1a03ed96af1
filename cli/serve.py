"""``versiq serve``: the HTTP API of a warehouse."""

from __future__ import annotations

from typing import Any

from versiq import settings
from versiq.cli.options import WAREHOUSE_HELP, Invocation, add_logging, warehouse_location


def _serve(inv: Invocation) -> int:
    from versiq.service.commands import serve_command

    return serve_command(inv.args, inv.parser)


def add_serve(sub: Any) -> None:
    srv = sub.add_parser(
        "serve",
        help="serve the HTTP query API",
        description="Serve VersionedKeyQuery / MultiVersionedKeyQuery over HTTP for every store "
        "of the warehouse. Every option also reads an environment variable.",
        epilog="A request head must arrive within VERSIQ_REQUEST_HEAD_TIMEOUT (default 10s) and its body "
        "within VERSIQ_REQUEST_BODY_TIMEOUT (default 60s) after it; request "
        "targets over 64 KiB are refused 414 and headers over 64 KiB 431. Exit status: 0 stopped, "
        "2 usage or configuration error, 3 could not start serving (e.g. the address is in use).",
    )
    srv.add_argument("--warehouse", default=settings.WAREHOUSE.value(), type=warehouse_location,
                     help=WAREHOUSE_HELP)
    srv.add_argument("--host", default=settings.HOST.value(),
                     help="bind address (env VERSIQ_HOST, default 127.0.0.1)")
    srv.add_argument("--port", type=int, default=settings.PORT.value(),
                     help="port (env VERSIQ_PORT, default 8080)")
    srv.add_argument("--workers", type=int, default=settings.WORKERS.value(),
                     help="worker processes (env VERSIQ_WORKERS, default 1)")
    add_logging(srv)
    srv.set_defaults(run=_serve)
