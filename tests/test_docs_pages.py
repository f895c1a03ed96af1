"""The documents stay where a reader looks for them: the README is a short page for people that
links every guide and reference page of docs/; the configuration page's tables of variables are
the registry of ``versiq.settings`` rendered (every ``VERSIQ_*`` variable the code reads is
declared there: tests/test_settings.py); the CLI reference documents every subcommand of
``versiq``. Links themselves are checked by tests/test_docs_links.py."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

from versiq import settings
from versiq.cli.main import build_parser

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def test_the_readme_is_short_and_links_every_page() -> None:
    text = _text(README)
    assert len(text.splitlines()) <= 200, "README.md is for people: move reference material to docs/"
    for page in ["docs/bring-your-own-data.md", "docs/cli.md", "docs/http-api.md", "docs/configuration.md",
                 "docs/limitations.md", "docs/architecture.md", "docs/semantics.md", "docs/contract.md",
                 "docs/benchmarks.md#current-figures"]:
        assert f"]({page})" in text, f"README.md does not link {page}"
    for command in ["make demo", "make test"]:
        assert command in text


def _table(text: str, heading: str) -> str:
    """The first Markdown table after ``heading`` in ``text``."""
    lines = text[text.index(heading):].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| "))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("| ")), len(lines))
    return "\n".join(lines[start:end]) + "\n"


def test_the_configuration_page_is_the_registry_rendered() -> None:
    page = _text(DOCS / "configuration.md")
    fix = "update docs/configuration.md from `python -m versiq.settings --markdown`"
    assert _table(page, "## Environment variables") == settings.markdown_table(settings.PRODUCT_ROWS), fix
    assert _table(page, "The tools around versiq") == settings.markdown_table(settings.TOOLING_ROWS), fix
    printed = subprocess.run([sys.executable, "-m", "versiq.settings", "--markdown"], capture_output=True,
                             text=True, check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout
    assert printed == settings.markdown_table(settings.PRODUCT_ROWS) + "\n" + settings.markdown_table(
        settings.TOOLING_ROWS), "what a developer pastes"


def _subcommands() -> list[str]:
    actions = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return sorted(name for action in actions for name in action.choices)


def test_the_cli_reference_documents_every_subcommand() -> None:
    text = _text(DOCS / "cli.md")
    subcommands = _subcommands()
    assert "ingest" in subcommands and "serve" in subcommands
    missing = [name for name in subcommands if not re.search(rf"`versiq {re.escape(name)}\b", text)]
    assert missing == [], f"docs/cli.md does not document: {missing}"
