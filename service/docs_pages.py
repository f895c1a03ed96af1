"""API documentation for people: Swagger UI at ``/docs`` and Redoc at ``/redoc``, both
rendering ``/openapi.json`` (the committed ``openapi.yaml``) from assets shipped in the package
(``service/static/docs/``, fetched from npm at development time by
``scripts/refresh-docs-assets.sh``), served under ``/static/docs/``. No page loads anything from
another host: no CDN, no fonts, Swagger UI's validator badge off (``validatorUrl: null``), and the
one image Redoc 2 takes from its CDN (the "API docs by Redocly" logo) is replaced by an empty
``data:`` URL when the bundle is served; the pages' Content-Security-Policy lets them talk to
their own server only.

The pages are open without a token, like ``/openapi.json``: they hold no data. Swagger UI's
"Authorize" button takes the bearer token its "Try it out" requests then send.

These routes are not in ``openapi.yaml``: it is the contract of the JSON API, which generated
clients and the schemathesis test are built from; HTML pages for a browser and their scripts are
not operations a client calls (the console at ``/`` is left out for the same reason).
``/openapi.json`` is in it because programs fetch it.
"""

from __future__ import annotations

import gzip
import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

DOCS_DIR = Path(__file__).with_name("static") / "docs"
ASSET_PREFIX = "/static/docs/"
JS = "text/javascript; charset=utf-8"
TEXT = "text/plain; charset=utf-8"
#: Every file served under ``/static/docs/`` with its media type (nothing else there is served).
ASSETS = {
    "swagger-ui/swagger-ui-bundle.js": JS,
    "swagger-ui/swagger-ui.css": "text/css; charset=utf-8",
    "swagger-ui/swagger-ui-bundle.js.LICENSE.txt": TEXT,
    "swagger-ui/LICENSE": TEXT,
    "swagger-ui/NOTICE": TEXT,
    "redoc/redoc.standalone.js": JS,
    "redoc/redoc.standalone.js.LICENSE.txt": TEXT,
    "redoc/LICENSE": TEXT,
    "swagger-init.js": JS,
    "redoc-init.js": JS,
}
#: Redoc 2's side menu shows this image from Redocly's CDN (unconditionally); served as an empty
#: ``data:`` URL the image fails to load and Redoc hides it (its ``onError``).
REDOC_LOGO = b"https://cdn.redoc.ly/redoc/logo-mini.svg"
#: The pages' own scripts and styles, inline styles (both UIs set them from script), images and
#: workers from data:/blob: URLs, requests to this server only.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
       "font-src 'self' data:; connect-src 'self'; worker-src 'self' blob:; base-uri 'none'; "
       "form-action 'none'; frame-ancestors 'none'")
#: The pages are small and revalidated on every load; they name each asset with a digest of its
#: bytes (``?v=``), so the assets can be cached for a year and an upgrade still loads new ones.
PAGE_HEADERS = {"cache-control": "no-cache", "x-content-type-options": "nosniff",
                "content-security-policy": CSP, "referrer-policy": "no-referrer"}
ASSET_HEADERS = {"cache-control": "public, max-age=31536000, immutable", "x-content-type-options": "nosniff"}
#: Assets smaller than this are not worth compressing.
GZIP_MIN_BYTES = 1024
#: The paths these routes answer (the middleware's metrics label them with these templates).
DOCS_ROUTES = frozenset({"/docs", "/redoc", *(ASSET_PREFIX + name for name in ASSETS)})

_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<link rel="icon" href="data:,">
{head}</head>
<body>
{body}</body>
</html>
"""


@dataclass(frozen=True)
class Asset:
    body: bytes
    gzipped: bytes | None
    media_type: str
    digest: str


@dataclass(frozen=True)
class Loaded:
    assets: dict[str, Asset]
    swagger_page: bytes
    redoc_page: bytes


@lru_cache(maxsize=1)
def loaded() -> Loaded:
    """The assets (read, Redoc's logo replaced, digested, compressed) and the two pages, built
    once per process on the first request (the files do not change while it runs)."""
    assets: dict[str, Asset] = {}
    for name, media_type in ASSETS.items():
        body = (DOCS_DIR / name).read_bytes()
        if name == "redoc/redoc.standalone.js":
            if body.count(REDOC_LOGO) != 1:
                raise RuntimeError(f"{name}: expected Redoc 2's CDN logo once (see scripts/refresh-docs-assets.sh)")
            body = body.replace(REDOC_LOGO, b"data:,")
        gzipped = gzip.compress(body, mtime=0) if len(body) >= GZIP_MIN_BYTES else None
        assets[name] = Asset(body, gzipped, media_type, hashlib.sha256(body).hexdigest()[:16])

    def url(name: str) -> str:
        # Relative: the pages work behind a proxy that serves the API under a path prefix.
        return f"{ASSET_PREFIX.lstrip('/')}{name}?v={assets[name].digest}"

    swagger = _PAGE.format(
        title="versiq API (Swagger UI)",
        head=f'<link rel="stylesheet" href="{url("swagger-ui/swagger-ui.css")}">\n',
        body=(f'<div id="swagger-ui"></div>\n<script src="{url("swagger-ui/swagger-ui-bundle.js")}"></script>\n'
              f'<script src="{url("swagger-init.js")}"></script>\n'),
    )
    redoc = _PAGE.format(
        title="versiq API (Redoc)",
        head="<style>body { margin: 0; }</style>\n",
        body=(f'<div id="redoc"></div>\n<script src="{url("redoc/redoc.standalone.js")}"></script>\n'
              f'<script src="{url("redoc-init.js")}"></script>\n'),
    )
    return Loaded(assets, swagger.encode("utf-8"), redoc.encode("utf-8"))


def accepts_gzip(accept_encoding: str | None) -> bool:
    """Whether an ``Accept-Encoding`` value allows gzip: ``gzip`` (or ``x-gzip``) with q > 0, or
    else ``*`` with q > 0 (RFC 9110, 12.5.3)."""
    explicit: float | None = None
    wildcard: float | None = None
    for item in (accept_encoding or "").split(","):
        coding, *params = (part.strip() for part in item.split(";"))
        q = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        if coding.lower() in ("gzip", "x-gzip"):
            explicit = q if explicit is None else max(explicit, q)
        elif coding == "*":
            wildcard = q
    chosen = explicit if explicit is not None else wildcard
    return chosen is not None and chosen > 0


def add_docs_routes(app: FastAPI) -> None:
    """``GET /docs``, ``GET /redoc`` and ``GET /static/docs/{asset}`` for the files of ``ASSETS``."""

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> Response:
        page = (await run_in_threadpool(loaded)).swagger_page
        return Response(page, media_type="text/html; charset=utf-8", headers=PAGE_HEADERS)

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> Response:
        page = (await run_in_threadpool(loaded)).redoc_page
        return Response(page, media_type="text/html; charset=utf-8", headers=PAGE_HEADERS)

    for name in ASSETS:
        app.add_api_route(ASSET_PREFIX + name, _asset_responder(name), methods=["GET"], include_in_schema=False)


def _asset_responder(name: str) -> Callable[[Request], Awaitable[Response]]:
    async def serve(request: Request) -> Response:
        asset = (await run_in_threadpool(loaded)).assets[name]
        if asset.gzipped is None:
            return Response(asset.body, media_type=asset.media_type, headers=ASSET_HEADERS)
        headers = {**ASSET_HEADERS, "vary": "accept-encoding"}
        if accepts_gzip(request.headers.get("accept-encoding")):
            return Response(asset.gzipped, media_type=asset.media_type, headers={**headers, "content-encoding": "gzip"})
        return Response(asset.body, media_type=asset.media_type, headers=headers)

    return serve
