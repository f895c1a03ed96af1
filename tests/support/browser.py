"""Headless Chromium from Debian's packages, driven by Playwright (never a downloaded browser).

``scripts/ensure-chromium.sh`` (run by ``make test``) installs it; ``VERSIQ_CHROMIUM`` points at
another binary. A ``PageWatch`` records what a page did that a test must see: console errors,
uncaught exceptions and every request, so a test can prove a page asked no host but the server.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from playwright.sync_api import Browser, ConsoleMessage, Page, Playwright, Request

CHROMIUM = os.environ.get("VERSIQ_CHROMIUM", "/usr/bin/chromium")
INSTALL_HINT = "run `make test` (scripts/ensure-chromium.sh installs Debian's chromium) or set VERSIQ_CHROMIUM"
# The flags the environment asks for: no sandbox (root in a container), no GPU, and none of the
# browser's own traffic (component updates, sync, safe browsing) so every request is the page's.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]


def chromium_present() -> bool:
    return Path(CHROMIUM).is_file() and os.access(CHROMIUM, os.X_OK)


def launch_chromium(playwright: Playwright) -> Browser:
    return playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)


@dataclass
class PageWatch:
    """What a page reported while a test used it."""

    page: Page
    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)

    @classmethod
    def attach(cls, page: Page) -> PageWatch:
        watch = cls(page)

        def on_console(message: ConsoleMessage) -> None:
            if message.type == "error":
                watch.errors.append(f"console: {message.text}")

        def on_request(request: Request) -> None:
            watch.requests.append(request.url)

        page.on("console", on_console)
        page.on("pageerror", lambda exc: watch.errors.append(f"uncaught: {exc}"))
        page.on("request", on_request)
        return watch

    def foreign_requests(self, base_url: str) -> list[str]:
        """Requests to any origin but ``base_url``'s (``data:`` and ``blob:`` URLs are local)."""
        own = urlsplit(base_url).netloc
        return [url for url in self.requests
                if urlsplit(url).scheme not in ("data", "blob") and urlsplit(url).netloc != own]
