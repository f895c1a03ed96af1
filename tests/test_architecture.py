"""The house rules (issue 11): one top-level package, imports go downward only, no circles.

Layers, bottom to top: the core (``versiq.layout``, ``timestamps``, ``durations``, ``names``,
``logs``, ``exits``: what every half shares), then ``versiq.ingest`` and ``versiq.query`` (two
halves that never import each other), then ``versiq.service`` (over query), then ``versiq.cli``
(the commands, the demo and the sample generator). Every import counts, lazy ones inside
functions included: a circle through a function-level import is still a circle of the design.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "versiq"

#: module prefix -> layer (higher may import lower, never the reverse)
LAYERS = {"versiq.cli": 3, "versiq.service": 2, "versiq.query": 1, "versiq.ingest": 1}
#: halves of one layer that must not import each other
SIBLINGS = {("versiq.ingest", "versiq.query"), ("versiq.query", "versiq.ingest"),
            ("versiq.service", "versiq.ingest")}
OLD_TOP_LEVEL = {"ingest", "query", "service", "cli"}


def _sources(root: Path) -> list[Path]:
    """Every .py file below ``root``, following the versiq/<half> links (Path.rglob does not)."""
    return sorted(Path(folder, name) for folder, _dirs, files in os.walk(root, followlinks=True)
                  for name in files if name.endswith(".py"))


def _modules() -> dict[str, Path]:
    out = {}
    for path in _sources(PACKAGE):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(["versiq", *parts])] = path
    return out


def _imports(module: str, path: Path) -> Iterator[tuple[str, int]]:
    """(imported module, line) for every import of ``module``, relative ones resolved."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            yield base, node.lineno
            for alias in node.names:  # ``from versiq.x import y`` may import the module x.y
                yield f"{base}.{alias.name}", node.lineno


def _layer(module: str) -> int:
    for prefix, layer in LAYERS.items():
        if module == prefix or module.startswith(prefix + "."):
            return layer
    return 0


def _half(module: str) -> str:
    return ".".join(module.split(".")[:2])


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        for target, _line in _imports(module, path):
            # ``from versiq.query import reads`` in a module of versiq.query names its own package
            # only to reach a sibling; the package is always initialised before its modules.
            if target in modules and target != module and not module.startswith(target + "."):
                graph[module].add(target)
                # importing a submodule runs every package __init__ on the way
                parent = target.rsplit(".", 1)[0]
                while parent in modules and parent != module and not module.startswith(parent + "."):
                    graph[module].add(parent)
                    parent = parent.rsplit(".", 1)[0]
    return graph


def test_one_top_level_package_and_no_old_names() -> None:
    offenders = []
    for path in sorted({*_sources(ROOT / "tests"), *_sources(ROOT / "bench"), *_sources(PACKAGE)}):
        if "generated" in path.parts:
            continue
        for target, line in _imports("tests.x", path):
            if target.split(".")[0] in OLD_TOP_LEVEL:
                offenders.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert not offenders, "import these through versiq.*:\n" + "\n".join(offenders)


def test_the_package_never_imports_the_tools_of_the_checkout() -> None:
    """``scripts/`` may use ``tests/support`` (the broker of make kafka and make demo-kafka); the
    versiq package never imports tests, scripts or benchmarks (docs/architecture.md, "Scripts and
    test support")."""
    offenders = [f"{path.relative_to(ROOT)}:{line} imports {target}" for module, path in _modules().items()
                 for target, line in _imports(module, path) if target.split(".")[0] in {"tests", "scripts", "bench"}]
    assert not offenders, "the package must not import these:\n" + "\n".join(offenders)


def test_imports_go_downward_only() -> None:
    modules = _modules()
    upward = []
    for module, path in modules.items():
        for target, line in _imports(module, path):
            if not target.startswith("versiq"):
                continue
            if _layer(target) > _layer(module) or (_half(module), _half(target)) in SIBLINGS:
                upward.append(f"{module}:{line} imports {target}")
    assert not upward, "imports that go up (or across halves):\n" + "\n".join(upward)


def test_no_import_circles() -> None:
    graph = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    counter = [0]

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    assert not circles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in circles)


def test_the_guard_sees_the_whole_house() -> None:
    modules = _modules()
    for half in ("versiq.ingest.pipeline", "versiq.query.reads", "versiq.service.app", "versiq.cli.main",
                 "versiq.layout"):
        assert half in modules
    assert any(_layer(m) == 3 for m in modules) and any(_layer(m) == 0 for m in modules)
