"""The API docs (service/docs_pages.py): Swagger UI at /docs and Redoc at /redoc from assets in the
package, against a live server with authentication on. Over HTTP the pages and assets come with
the right types and caching and name no other host; in a real browser (Debian's headless
Chromium driven by Playwright) both render the operations of openapi.yaml, log no error and ask
no host but the server, and Swagger UI's "Authorize" sends the bearer token. Screenshots go to each
test's ``tmp_path``."""

from __future__ import annotations

import fnmatch
import hashlib
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

import httpx
import pytest

from tests.support.browser import PageWatch
from tests.support.service import build_warehouse, live_server
from versiq.service.docs_pages import ASSETS, DOCS_DIR, REDOC_LOGO, accepts_gzip
from versiq.service.settings import Settings

ROOT = Path(__file__).resolve().parents[2]  # the repository
TOKEN = "docs-secret"
#: Every absolute URL in a text.
URL = re.compile(r"""https?://[^\s"'<>()]+""")
#: The assets a page loads (``src``/``href``).
LINKS = re.compile(r"""(?:src|href)="([^"]+)\"""")


@pytest.fixture(scope="module")
def docs_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    warehouse = build_warehouse(str(tmp_path_factory.mktemp("docs-wh")))
    settings = Settings.from_env({"VERSIQ_WAREHOUSE": warehouse.path, "VERSIQ_API_TOKENS": TOKEN})
    with live_server(settings) as url:
        yield url


@pytest.fixture
def open_docs(browser, docs_url: str, tmp_path: Path) -> Iterator:
    """``open_docs(path)`` -> (page, watch); every page is screenshotted into ``tmp_path`` at the
    end and must have logged no error and asked no host but the server."""
    opened: list[tuple[str, Any, PageWatch]] = []

    def open_(path: str) -> tuple[Any, PageWatch]:
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        page = context.new_page()
        watch = PageWatch.attach(page)
        opened.append((path, context, watch))
        page.goto(docs_url + path)
        return page, watch

    yield open_
    for path, context, watch in opened:
        watch.page.screenshot(path=str(tmp_path / f"{path.strip('/')}.png"), full_page=False)
        assert watch.errors == [], path
        assert watch.foreign_requests(docs_url) == [], path
        context.close()


def test_pages_and_assets_over_http(docs_url: str) -> None:
    host = urlsplit(docs_url).netloc
    with httpx.Client(base_url=docs_url, timeout=30) as client:
        assert client.get("/v1/stores").status_code == 401  # auth is on ...
        assert client.get("/openapi.json").status_code == 200  # ... and the docs need no token
        seen: set[str] = set()
        for path, needs in (("/docs", "swagger-ui-bundle.js"), ("/redoc", "redoc.standalone.js")):
            page = client.get(path)
            assert page.status_code == 200, path
            assert page.headers["content-type"] == "text/html; charset=utf-8"
            assert page.headers["cache-control"] == "no-cache"
            csp = page.headers["content-security-policy"]
            assert "connect-src 'self'" in csp and "script-src 'self';" in csp and "default-src 'none'" in csp
            html = page.text
            assert [u for u in URL.findall(html) if urlsplit(u).netloc != host] == [], path
            assert "googleapis" not in html and "cdn" not in html.lower(), path
            links = [link for link in LINKS.findall(html) if not link.startswith("data:")]
            assert any(needs in link for link in links), links
            for link in links:
                url = urljoin(docs_url + path, link)
                assert urlsplit(url).netloc == host, url
                seen.add(urlsplit(url).path)
                _check_asset(client, url)
        assert seen == {"/static/docs/" + name for name in ASSETS if not _is_licence(name)}
        for name in ASSETS:  # the licences are served too (the bundles' banners point at them)
            if _is_licence(name):
                r = client.get("/static/docs/" + name)
                assert r.status_code == 200 and r.headers["content-type"] == "text/plain; charset=utf-8"
        assert client.get("/static/docs/swagger-ui/index.html").status_code == 404  # only the listed files
        assert client.get("/static/docs/SHA256SUMS").status_code == 404
        assert client.head("/redoc").headers["content-length"] == str(len(client.get("/redoc").content))
        metrics = client.get("/metrics", headers={"authorization": f"Bearer {TOKEN}"}).text
        assert 'route="/docs"' in metrics and 'route="/static/docs/redoc/redoc.standalone.js"' in metrics


def _is_licence(name: str) -> bool:
    return "LICENSE" in name or name.endswith("NOTICE")


def _check_asset(client: httpx.Client, url: str) -> None:
    name = urlsplit(url).path.removeprefix("/static/docs/")
    assert re.fullmatch(r"v=[0-9a-f]{16}", urlsplit(url).query), url  # a digest: a new file is a new URL
    expected = (DOCS_DIR / name).read_bytes()
    if name == "redoc/redoc.standalone.js":
        expected = expected.replace(REDOC_LOGO, b"data:,")
    media = "text/css; charset=utf-8" if name.endswith(".css") else "text/javascript; charset=utf-8"
    plain = client.get(url, headers={"accept-encoding": "identity"})
    assert plain.status_code == 200, url
    assert plain.headers["content-type"] == media, url
    assert plain.headers["cache-control"] == "public, max-age=31536000, immutable", url
    assert plain.headers["x-content-type-options"] == "nosniff"
    assert "content-encoding" not in plain.headers and plain.content == expected, url
    if len(expected) >= 1024:
        assert plain.headers["vary"] == "accept-encoding"
        packed = client.get(url, headers={"accept-encoding": "gzip"})
        assert packed.headers["content-encoding"] == "gzip" and packed.content == expected, url
        assert int(packed.headers["content-length"]) < len(expected) // 2, url


def test_accepts_gzip() -> None:
    assert accepts_gzip("gzip, deflate, br") and accepts_gzip("br;q=1.0, gzip;q=0.8") and accepts_gzip("*")
    assert accepts_gzip("x-gzip") and accepts_gzip("*;q=0.5, identity")
    assert not accepts_gzip(None) and not accepts_gzip("") and not accepts_gzip("identity, br")
    assert not accepts_gzip("gzip;q=0") and not accepts_gzip("*, gzip;q=0") and not accepts_gzip("*;q=0")


def test_assets_are_the_npm_files_and_the_wheel_carries_them() -> None:
    """The vendored files are byte for byte what scripts/refresh-docs-assets.sh took from npm
    (SHA256SUMS), and pyproject.toml's package data names every file served."""
    lines = (DOCS_DIR / "SHA256SUMS").read_text().splitlines()
    assert lines[0].startswith("# npm packages: swagger-ui-dist@") and " redoc@2." in lines[0]
    sums = {name: digest for digest, name in (line.split("  ", 1) for line in lines[1:])}
    assert set(sums) == {name for name in ASSETS if "/" in name}
    for name, digest in sums.items():
        assert hashlib.sha256((DOCS_DIR / name).read_bytes()).hexdigest() == digest, name
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    # Each package's patterns, as paths below versiq/service ("versiq.service.static.docs": "static/docs/").
    patterns = [("/".join(package.split(".")[2:] + [pattern]))
                for package, globs in pyproject["tool"]["setuptools"]["package-data"].items()
                if package == "versiq.service" or package.startswith("versiq.service.") for pattern in globs]
    service = DOCS_DIR.parents[1]
    for name in [*ASSETS, "README.md", "SHA256SUMS"]:
        relative = (DOCS_DIR / name).relative_to(service).as_posix()
        assert any(fnmatch.fnmatchcase(relative, p) and p.count("/") == relative.count("/") for p in patterns), name


def test_swagger_ui_renders_offline_and_authorizes(open_docs) -> None:
    page, watch = open_docs("/docs")
    operation = page.wait_for_selector("#operations-queries-getKey", timeout=30_000)
    assert "/v1/stores/{store}/keys/{key}" in operation.inner_text()
    assert page.locator(".opblock").count() >= 17  # every operation of openapi.yaml
    # "Authorize" takes the bearer token, which "Try it out" then sends
    page.click("button.authorize")
    page.fill(".modal-ux input#auth-bearer-value", TOKEN)
    page.click(".modal-ux .auth-btn-wrapper button.authorize")
    page.click(".modal-ux button.btn-done")
    page.click("#operations-stores-listStores .opblock-summary")
    page.click("#operations-stores-listStores .try-out__btn")
    with page.expect_response(lambda r: urlsplit(r.url).path == "/v1/stores") as answer:
        page.click("#operations-stores-listStores button.execute")
    assert answer.value.status == 200
    assert answer.value.request.headers["authorization"] == f"Bearer {TOKEN}"
    page.wait_for_selector("#operations-stores-listStores .live-responses-table")
    assert "prices" in page.inner_text("#operations-stores-listStores .live-responses-table")
    assert any(urlsplit(u).path == "/openapi.json" for u in watch.requests)


def test_redoc_renders_offline(open_docs) -> None:
    page, watch = open_docs("/redoc")
    title = page.wait_for_selector("h2:has-text('Latest value of a key, or its value as of a time')",
                                   timeout=30_000)
    assert title.is_visible()
    assert page.get_by_text("/v1/stores/{store}/keys/{key}", exact=True).count() >= 1
    assert page.locator("img[src*='redoc.ly']").count() == 0
    fonts = page.evaluate("getComputedStyle(document.querySelector('h1')).fontFamily")
    assert "Montserrat" not in fonts, fonts
    assert any(urlsplit(u).path == "/openapi.json" for u in watch.requests)
