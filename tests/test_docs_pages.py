"""The documents stay where a reader looks for them: the README is a short page for people that
links every guide and reference page of docs/; the configuration page lists every ``VERSIQ_*``
variable the code reads (and no other); the CLI reference documents every subcommand of
``versiq``. Links themselves are checked by tests/test_docs_links.py."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from versiq.cli.main import build_parser

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
#: The folders of the product's code (tests and benchmarks set variables of their own).
PRODUCT = ["versiq", "ingest", "query", "service", "cli"]
#: ``VERSIQ_KAFKA_SASL_JAAS_CONFIG`` and the like are one documented family.
KAFKA_FAMILY = "VERSIQ_KAFKA_<NAME>"


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


def _variables_in_code() -> set[str]:
    names: set[str] = set()
    for folder in PRODUCT:
        for path in (ROOT / folder).rglob("*.py"):
            names.update(re.findall(r"\bVERSIQ_[A-Z0-9_]*[A-Z0-9]\b", _text(path)))
    return {KAFKA_FAMILY if name.startswith("VERSIQ_KAFKA_") else name for name in names}


def test_the_configuration_page_lists_every_variable_the_code_reads() -> None:
    table = set(re.findall(r"^\| `(VERSIQ_[A-Z0-9_<>]+)`", _text(DOCS / "configuration.md"), flags=re.M))
    code = _variables_in_code()
    assert code - table == set(), "variables the code reads that docs/configuration.md does not list"
    assert table - code == set(), "variables docs/configuration.md lists that the code does not read"


def _subcommands() -> list[str]:
    actions = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return sorted(name for action in actions for name in action.choices)


def test_the_cli_reference_documents_every_subcommand() -> None:
    text = _text(DOCS / "cli.md")
    subcommands = _subcommands()
    assert "ingest" in subcommands and "serve" in subcommands
    missing = [name for name in subcommands if not re.search(rf"`versiq {re.escape(name)}\b", text)]
    assert missing == [], f"docs/cli.md does not document: {missing}"
