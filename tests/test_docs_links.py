"""The project's documents cite only what the repository has (issue 18): every relative link of
README.md and docs/**/*.md names a file or folder that exists (and, with a #fragment, a heading
of that document), every rule these documents cite ("rule 7", "rules 13-18 and 23-30") is a rule
of docs/semantics.md, and no tracked file cites the upper-case SEMANTICS.md / CONTRACT.md of the
proposals this project came from (its own rules are docs/semantics.md and docs/contract.md)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
#: ``[text](target)`` links; images too. The target ends at whitespace or ``)``.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FOREIGN_DOCUMENTS = re.compile(r"\b(SEMANTICS|CONTRACT)\.md\b")
#: "rule 7", "rules 6–11, 22", "rules 13-18 and 23-30", "rules 9, 10 and 22" (across a line break too).
_NUMBERS = r"\d+(?:\s*[–-]\s*\d+)?"
RULE_CITATION = re.compile(rf"\b[Rr]ules? ({_NUMBERS}(?:(?:,\s*|,?\s+(?:and|or)\s+){_NUMBERS})*)")


def _relative_links(document: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", document.read_text(encoding="utf-8"), flags=re.S)  # code blocks
    text = re.sub(r"`[^`\n]*`", "", text)  # inline code
    targets = [m.group(1) for m in LINK.finditer(text)]
    return [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", t)]


def _anchors(document: Path) -> set[str]:
    """The ids GitHub gives the document's headings: lower case, punctuation dropped, spaces as
    hyphens, repeats numbered -1, -2, ..."""
    text = re.sub(r"```.*?```", "", document.read_text(encoding="utf-8"), flags=re.S)
    seen: dict[str, int] = {}
    anchors = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.replace("`", "").strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def _resolves(document: Path, target: str) -> bool:
    path, _, anchor = target.partition("#")
    linked = document.parent / path if path else document
    if not linked.exists():
        return False
    return not anchor or linked.suffix != ".md" or anchor in _anchors(linked)


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_names_something_that_exists(document: Path) -> None:
    missing = [target for target in _relative_links(document) if not _resolves(document, target)]
    assert missing == [], f"{document.relative_to(ROOT)} links to what the repository lacks: {missing}"


def test_no_file_cites_documents_the_repository_does_not_have() -> None:
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    citing = []
    for name in tracked.splitlines():
        path = ROOT / name
        if name.startswith("service/static/") or not path.is_file() or path.stat().st_size > 2_000_000:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        if name != "tests/test_docs_links.py" and FOREIGN_DOCUMENTS.search(text):
            citing.append(name)
    assert citing == [], f"these files cite documents the repository does not have: {citing}"


def _cited_rules(text: str) -> set[int]:
    cited: set[int] = set()
    for citation in RULE_CITATION.finditer(text):
        for low, high in re.findall(r"(\d+)(?:\s*[–-]\s*(\d+))?", citation.group(1)):
            cited.update(range(int(low), int(high or low) + 1))
    return cited


def test_every_cited_rule_is_in_the_semantics() -> None:
    semantics = (ROOT / "docs" / "semantics.md").read_text(encoding="utf-8")
    rules = {int(n) for n in re.findall(r"^\*\*Rule (\d+) —", semantics, flags=re.M)}
    unknown = {str(d.relative_to(ROOT)): sorted(_cited_rules(d.read_text(encoding="utf-8")) - rules)
               for d in DOCUMENTS}
    assert {d: n for d, n in unknown.items() if n} == {}, "rules cited that docs/semantics.md lacks"
