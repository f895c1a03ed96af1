"""The registry of ``VERSIQ_*`` variables (``versiq.settings``): the one place that reads them,
the source of docs/configuration.md's tables, and the CLI's warning for a misspelt one."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from versiq import settings

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "versiq"
REGISTRY_FILE = PACKAGE / "settings.py"
#: Mapping methods that read a key (``setdefault`` and ``pop`` set or unset it: allowed).
READS = {"get", "getenv", "__getitem__", "__contains__"}


def _sources() -> list[Path]:
    """Every .py file of the product, following the versiq/<half> links."""
    return sorted(Path(folder, name) for folder, _dirs, files in os.walk(PACKAGE, followlinks=True)
                  for name in files if name.endswith(".py"))


def _names_constants(tree: ast.AST) -> set[str]:
    """Module-level names bound to a variable's name: ``X_ENV = "VERSIQ_X"`` or ``= settings.X.name``."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = node.value
            if (isinstance(value, ast.Constant) and isinstance(value.value, str)
                    and value.value.startswith(settings.PREFIX)) or \
                    (isinstance(value, ast.Attribute) and _names_a_variable(value, set())):
                out.add(node.targets[0].id)
    return out


def _names_a_variable(key: ast.expr, constants: set[str]) -> bool:
    if isinstance(key, ast.Constant):
        return isinstance(key.value, str) and key.value.startswith(settings.PREFIX)
    if isinstance(key, ast.JoinedStr) and key.values:
        return _names_a_variable(key.values[0], constants)
    if isinstance(key, ast.Attribute) and key.attr == "name":  # settings.PORT.name, PORT.name
        owner = key.value
        return (isinstance(owner, ast.Name) and owner.id.isupper()) or \
            (isinstance(owner, ast.Attribute) and owner.attr.isupper())
    return isinstance(key, ast.Name) and key.id in constants


def environment_reads(source: str, constants: set[str]) -> list[int]:
    """Lines of ``source`` that read a ``VERSIQ_*`` variable from a mapping (``os.environ.get(...)``,
    ``env[...]``, ``os.getenv(...)``, ``... in os.environ``) instead of asking the registry."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in READS:
            keys = node.args[:1]
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            keys = [node.slice]
        elif isinstance(node, ast.Compare) and any(isinstance(op, ast.In | ast.NotIn) for op in node.ops):
            keys = [node.left]
        else:
            continue
        if any(_names_a_variable(key, constants) for key in keys):
            lines.append(node.lineno)
    return lines


def test_only_the_registry_reads_versiq_variables() -> None:
    trees = {path: ast.parse(path.read_text(encoding="utf-8"), str(path)) for path in _sources()}
    constants = set().union(*(_names_constants(tree) for path, tree in trees.items() if path != REGISTRY_FILE))
    offenders = [f"{path.relative_to(PACKAGE)}:{line}" for path in trees if path != REGISTRY_FILE
                 for line in environment_reads(path.read_text(encoding="utf-8"), constants)]
    assert offenders == [], "read these through versiq.settings (SETTING.value()):\n" + "\n".join(offenders)


def test_every_declared_variable_is_read() -> None:
    """No declaration outlives its reader: the product's through the registry, the tooling's by name."""
    product = "\n".join(path.read_text(encoding="utf-8") for path in _sources() if path != REGISTRY_FILE)
    tooling = "\n".join(path.read_text(encoding="utf-8", errors="replace")
                        for folder in ("tests", "bench", "scripts") for path in (ROOT / folder).rglob("*")
                        if path.is_file() and path.suffix in (".py", ".sh") and path != Path(__file__))
    tooling += (ROOT / "compose.yaml").read_text(encoding="utf-8") + (ROOT / "Makefile").read_text(encoding="utf-8")
    unread = []
    for ident, entry in vars(settings).items():
        if not isinstance(entry, settings.Setting | settings.Family):
            continue
        if entry.reader in settings.TOOLING_READERS:
            if entry.name not in tooling:
                unread.append(entry.name)
        elif not re.search(rf"\b{ident}\.(value|values|text|name)\b", product):
            unread.append(entry.name)
    assert unread == [], "declared in versiq/settings.py but read nowhere"


def test_the_guard_sees_reads_and_lets_writes_through() -> None:
    reads = ['os.environ.get("VERSIQ_PORT", "8080")', 'os.environ["VERSIQ_PORT"]', 'env.get(PORT_ENV)',
             'os.getenv(f"VERSIQ_{name}")', 'env.get(settings.PORT.name)', '"VERSIQ_PORT" in os.environ']
    for code in reads:
        assert environment_reads(code, {"PORT_ENV"}) == [1], code
    writes = ['os.environ["VERSIQ_PORT"] = "1"', 'os.environ.setdefault(settings.TOKEN_SECRET.name, "x")',
              'os.environ.pop(PORT_ENV, None)', 'env.get("SPARK_MASTER", "local")', 'settings.PORT.value()']
    for code in writes:
        assert environment_reads(code, {"PORT_ENV"}) == [], code


def test_a_value_is_read_when_asked_for_and_a_bad_one_names_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(settings.PORT.name, raising=False)
    assert settings.PORT.value() == 8080
    monkeypatch.setenv(settings.PORT.name, "9000")
    assert settings.PORT.value() == 9000  # not cached
    monkeypatch.setenv(settings.PORT.name, "")
    assert settings.PORT.value() == 8080  # empty: the default
    monkeypatch.setenv(settings.PORT.name, "eighty")
    with pytest.raises(settings.SettingError, match="VERSIQ_PORT: 'eighty' is not a whole number"):
        settings.PORT.value()
    assert settings.LEASE_TTL.value({"VERSIQ_LEASE_TTL": "1m"}) == 60.0
    with pytest.raises(ValueError, match=re.escape("VERSIQ_LEASE_TTL: must be at least 3s (got '1s')")):
        settings.LEASE_TTL.value({"VERSIQ_LEASE_TTL": "1s"})
    with pytest.raises(ValueError, match="VERSIQ_DERIVE_HERE_RECORDS: 'many' is not a whole number"):
        settings.DERIVE_HERE_RECORDS.value({"VERSIQ_DERIVE_HERE_RECORDS": "many"})
    assert settings.CORS_ORIGINS.value({"VERSIQ_CORS_ORIGINS": " https://a, ,https://b "}) == ("https://a", "https://b")
    assert settings.DRIVER_AUTOSTART.value({"VERSIQ_DRIVER_AUTOSTART": "0s"}) is None
    assert settings.KAFKA.values({"VERSIQ_KAFKA_SASL_MECHANISM": "PLAIN", "VERSIQ_KAFKA_": "x"}) == \
        {"SASL_MECHANISM": "PLAIN"}


def test_overridden_restores_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(settings.PARSE_HERE_BYTES.name, "5")
    monkeypatch.delenv(settings.INTERPRETED_RUN_BYTES.name, raising=False)
    with settings.overridden({settings.PARSE_HERE_BYTES: "0", settings.INTERPRETED_RUN_BYTES: "0"}):
        assert settings.PARSE_HERE_BYTES.value() == 0 and settings.INTERPRETED_RUN_BYTES.value() == 0
    assert os.environ[settings.PARSE_HERE_BYTES.name] == "5"
    assert settings.INTERPRETED_RUN_BYTES.name not in os.environ


def _versiq(*args: str, extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The real CLI, in an environment of no VERSIQ_* variable but ``extra``."""
    env = {name: value for name, value in os.environ.items() if not name.startswith(settings.PREFIX)}
    return subprocess.run([sys.executable, "-m", "versiq.cli", *args], capture_output=True, text=True,
                          timeout=60, env={**env, "PYTHONPATH": str(ROOT), **extra})


def test_a_misspelt_variable_gets_one_warning_naming_the_closest(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-warehouse")  # serve stops at once, after its start-up checks
    out = _versiq("serve", "--warehouse", missing, extra={"VERSIQ_PARSE_HERE_BYTE": "2", "VERSIQ_ZZZ": "1"})
    assert out.returncode == 2, out.stderr
    warnings = [line for line in out.stderr.splitlines() if "unknown environment variable" in line]
    assert len(warnings) == 2, out.stderr  # one each, though the CLI and serve both check
    assert "VERSIQ_PARSE_HERE_BYTE: did you mean VERSIQ_PARSE_HERE_BYTES?" in warnings[0]
    assert "VERSIQ_ZZZ: see docs/configuration.md" in warnings[1]
    known = {"VERSIQ_PARSE_HERE_BYTES": "2", "VERSIQ_KAFKA_SECURITY_PROTOCOL": "SSL", "VERSIQ_CONFORMANCE_SEED": "1",
             "VERSIQ_LOG_LEVEL": "WARNING"}
    out = _versiq("serve", "--warehouse", missing, extra=known)
    assert out.returncode == 2 and "unknown environment variable" not in out.stderr, out.stderr


def test_a_bad_value_of_an_option_default_is_a_usage_error() -> None:
    out = _versiq("serve", extra={"VERSIQ_PORT": "eighty"})
    assert out.returncode == 2 and "VERSIQ_PORT: 'eighty' is not a whole number" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
