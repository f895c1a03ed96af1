"""Every normative rule of docs/semantics.md has at least one test marked with it
(``@pytest.mark.rule(N)``), and no test cites a rule the document does not have (issue 11)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SEMANTICS = ROOT / "docs" / "semantics.md"


def document_rules() -> set[int]:
    return {int(n) for n in re.findall(r"^\*\*Rule (\d+) —", SEMANTICS.read_text(), re.M)}


def _rule_numbers(node: ast.expr) -> list[int]:
    """The numbers of a ``pytest.mark.rule(...)`` call, or [] for anything else."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "rule"
            and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "mark"):
        return [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, int)]
    return []


def marked_rules() -> dict[int, list[str]]:
    """rule -> the tests marked with it (``file::test``; a module-level ``pytestmark`` marks all)."""
    out: dict[int, list[str]] = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        tree = ast.parse(path.read_text(), str(path))
        where = str(path.relative_to(ROOT))
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark"
                                                    for t in node.targets):
                marks = node.value.elts if isinstance(node.value, (ast.List, ast.Tuple)) else [node.value]
                for mark in marks:
                    for n in _rule_numbers(mark):
                        out.setdefault(n, []).append(where)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                for decorator in node.decorator_list:
                    for n in _rule_numbers(decorator):
                        out.setdefault(n, []).append(f"{where}::{node.name}")
    return out


def test_every_rule_has_a_marked_test() -> None:
    rules = document_rules()
    assert len(rules) >= 30 and rules == set(range(1, max(rules) + 1)), "rules are numbered 1..N"
    marked = marked_rules()
    missing = sorted(rules - set(marked))
    assert not missing, f"rules of docs/semantics.md without a test marked @pytest.mark.rule(N): {missing}"
    unknown = {n: tests for n, tests in marked.items() if n not in rules}
    assert not unknown, f"tests cite rules docs/semantics.md does not have: {unknown}"
