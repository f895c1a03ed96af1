"""The web console: one static page at ``/`` and its two assets under ``/console/``,
shipped in the package (``service/console/``), no build step, nothing fetched from another host.

The page is open like ``/openapi.json``: it holds no data. Everything it shows comes from the
``/v1`` API of the same server, under the same auth: with tokens configured the console asks for
one and sends it as ``Authorization: Bearer``. These routes are not part of the API contract
(``openapi.yaml``), which describes the JSON API only.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import Response

CONSOLE_DIR = Path(__file__).with_name("console")
#: The files the console is made of, with their media types (nothing else under the folder is served).
ASSETS = {
    "console.js": "text/javascript; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
}
#: The page may load its own assets and talk to its own server, nothing else.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
       "form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
#: Assets are revalidated on every load (a few KB; an upgrade must never run an old script).
HEADERS = {"cache-control": "no-cache", "x-content-type-options": "nosniff"}
#: The paths these routes answer (the middleware's metrics label them with these templates).
CONSOLE_ROUTES = frozenset({"/", *(f"/console/{name}" for name in ASSETS)})


def _read(name: str) -> bytes:
    return (CONSOLE_DIR / name).read_bytes()


def add_console_routes(app: FastAPI) -> None:
    """``GET /`` (the page) and ``GET /console/{asset}``; the files are read once, at start."""
    page = _read("index.html")
    assets = {name: (_read(name), media) for name, media in ASSETS.items()}

    @app.get("/", include_in_schema=False)
    async def console_page() -> Response:
        return Response(page, media_type="text/html; charset=utf-8",
                        headers={**HEADERS, "content-security-policy": CSP})

    for name, (body, media) in assets.items():
        app.add_api_route(f"/console/{name}", _responder(body, media), methods=["GET"], include_in_schema=False)


def _responder(body: bytes, media_type: str) -> Callable[[], Awaitable[Response]]:
    """An endpoint without parameters that answers ``body`` (FastAPI would read the parameters
    of a function with defaults as query parameters)."""
    async def serve() -> Response:
        return Response(body, media_type=media_type, headers=HEADERS)

    return serve
