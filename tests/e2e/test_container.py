"""The Dockerfile and compose.yaml run real ``versiq`` commands, consistently.

No Docker engine runs here, so the files are parsed and every command they run is checked
against the real CLI parser; the image's default command is started as a process with the
image's environment and must answer ``/healthz``, and the image's HEALTHCHECK command itself
must pass against it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import yaml

from tests.support.server_process import free_ports
from versiq.cli.main import build_parser
from versiq.durations import parse_duration_ms
from versiq.names import is_valid_store_name

ROOT = Path(__file__).resolve().parents[2]  # the repository
VERSIQ_ENV = ("VERSIQ_WAREHOUSE", "VERSIQ_HOST", "VERSIQ_PORT", "VERSIQ_WORKERS",
              "VERSIQ_LOG_FORMAT", "VERSIQ_LOG_LEVEL")


@dataclass
class Dockerfile:
    base: str = ""
    env: dict[str, str] = field(default_factory=dict)
    user: str = "root"
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    volumes: list[str] = field(default_factory=list)
    expose: list[str] = field(default_factory=list)
    healthcheck: list[str] = field(default_factory=list)
    copies: list[list[str]] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)


def _instructions(text: str) -> Iterator[tuple[str, str]]:
    """(INSTRUCTION, arguments) with comments dropped and continuation lines joined."""
    logical = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            logical += stripped[:-1] + " "
            continue
        logical += stripped
        instruction, _, rest = logical.partition(" ")
        yield instruction.upper(), rest.strip()
        logical = ""
    assert not logical, "dangling line continuation"


def _exec_form(text: str) -> list[str]:
    value = json.loads(text)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), text
    return value


def parse_dockerfile(path: Path) -> Dockerfile:
    df = Dockerfile()
    for instruction, rest in _instructions(path.read_text(encoding="utf-8")):
        if instruction == "FROM":
            df.base = rest
        elif instruction == "ENV":
            for item in shlex.split(rest):
                name, sep, value = item.partition("=")
                assert sep, f"ENV {item!r} is not NAME=value"
                df.env[name] = value
        elif instruction == "USER":
            df.user = rest
        elif instruction == "ENTRYPOINT":
            df.entrypoint = _exec_form(rest)
        elif instruction == "CMD":
            df.cmd = _exec_form(rest)
        elif instruction == "VOLUME":
            df.volumes += _exec_form(rest) if rest.startswith("[") else rest.split()
        elif instruction == "EXPOSE":
            df.expose += rest.split()
        elif instruction == "HEALTHCHECK":
            _options, sep, command = rest.partition("CMD ")
            assert sep, "HEALTHCHECK without CMD"
            df.healthcheck = _exec_form(command)
        elif instruction == "COPY":
            df.copies.append(rest.split())
        elif instruction == "RUN":
            df.runs.append(rest)
    return df


@pytest.fixture(scope="module")
def dockerfile() -> Dockerfile:
    return parse_dockerfile(ROOT / "Dockerfile")


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "compose.yaml").read_text(encoding="utf-8"))


def parse_versiq(argv: list[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch):
    """Parse ``argv`` (after the ``versiq`` program name) as the CLI would under ``env``."""
    for name in VERSIQ_ENV:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    try:
        return build_parser().parse_args(argv)  # defaults read the environment when built
    except SystemExit as exc:
        pytest.fail(f"`versiq {shlex.join(argv)}` is not a valid versiq command (exit {exc.code})")


def _subparser(name: str) -> argparse.ArgumentParser:
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[name]
    raise AssertionError("versiq has no subcommands")


def _named_mounts(service: dict) -> dict[str, str]:
    """Container path -> source for every short-syntax volume of a compose service."""
    mounts = {}
    for spec in service.get("volumes", []):
        # Compose interpolation with a default, ${NAME:-default}: take the default.
        spec = re.sub(r"\$\{[A-Za-z_][A-Za-z0-9_]*:-([^}]*)\}", r"\1", spec)
        parts = spec.split(":")
        mounts[parts[1]] = parts[0]
    return mounts


# ------------------------------------------------------------------------------ Dockerfile


def test_dockerfile_base_user_and_jre(dockerfile: Dockerfile) -> None:
    assert dockerfile.base == "python:3.11-slim-bookworm"
    assert dockerfile.user not in ("root", "0", "")
    assert any("openjdk-17-jre-headless" in run for run in dockerfile.runs)
    assert any("pip install --no-cache-dir ." in run for run in dockerfile.runs)


def test_dockerfile_installs_every_package(dockerfile: Dockerfile) -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    packages = pyproject["tool"]["setuptools"]["packages"]
    copied = {Path(src).name for copy in dockerfile.copies for src in copy[:-1]}
    top_level = sorted({name.split(".")[0] for name in packages})
    for needed in [*top_level, "pyproject.toml", pyproject["project"]["readme"]]:
        assert needed in copied, f"the Dockerfile does not COPY {needed}"
    ignored = {
        line.strip() for line in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    }
    assert not ignored & copied, "a file the Dockerfile copies is in .dockerignore"


def test_every_python_package_is_installed() -> None:
    """`packages` is an explicit list: a subpackage missing from it would be absent from the
    image and from executors that install the project (but present in editable installs)."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    packages = set(pyproject["tool"]["setuptools"]["packages"])
    for top in {name.split(".")[0] for name in packages}:
        for init in (ROOT / top).rglob("__init__.py"):
            dotted = ".".join(init.parent.relative_to(ROOT).parts)
            assert dotted in packages, f"package {dotted} is not in [tool.setuptools] packages"


def test_dockerfile_default_command_is_versiq_serve(
    dockerfile: Dockerfile, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert dockerfile.entrypoint == ["versiq"]
    args = parse_versiq(dockerfile.cmd, dockerfile.env, monkeypatch)
    assert args.command == "serve"
    assert args.log_format == "json"
    assert args.host == "0.0.0.0"  # reachable through the published port
    assert [args.warehouse] == dockerfile.volumes == ["/warehouse"]
    assert [p.split("/")[0] for p in dockerfile.expose] == [str(args.port)]
    assert dockerfile.env["PYSPARK_PYTHON"] == "python3"


def test_dockerfile_ingest_runs_in_the_same_image(
    dockerfile: Dockerfile, monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = ["ingest", "--warehouse", dockerfile.volumes[0], "--store", "prices", "--source", "/data"]
    args = parse_versiq(argv, dockerfile.env, monkeypatch)
    assert args.command == "ingest"


def test_healthcheck_asks_readyz_with_python(dockerfile: Dockerfile) -> None:
    assert dockerfile.healthcheck[0] == "python3"  # no curl in slim images
    script = " ".join(dockerfile.healthcheck)
    assert "/readyz" in script
    assert "VERSIQ_PORT" in script


# ------------------------------------------------------------------------------ compose


def test_compose_commands_are_versiq_commands(
    compose: dict, dockerfile: Dockerfile, monkeypatch: pytest.MonkeyPatch
) -> None:
    services = compose["services"]
    assert set(services) == {"ingest", "query", "s3", "ingest-s3", "query-s3"}
    for name, service in services.items():
        if name == "s3":
            continue
        assert service.get("build") == ".", f"{name} is not built from this Dockerfile"
        assert "entrypoint" not in service, f"{name} must keep the image's versiq entrypoint"
    assert services["ingest"]["image"] == services["query"]["image"]

    ingest = parse_versiq(services["ingest"]["command"], dockerfile.env, monkeypatch)
    assert ingest.command == "ingest"
    assert ingest.continuous
    assert ingest.config

    query_env = {**dockerfile.env, **{k: str(v) for k, v in services["query"].get("environment", {}).items()}}
    query = parse_versiq(services["query"]["command"], query_env, monkeypatch)
    assert query.command == "serve"
    assert query.host == "0.0.0.0"


def test_compose_volumes_and_ports_are_consistent(
    compose: dict, dockerfile: Dockerfile, monkeypatch: pytest.MonkeyPatch
) -> None:
    services = compose["services"]
    assert "warehouse" in compose["volumes"]
    ingest = parse_versiq(services["ingest"]["command"], dockerfile.env, monkeypatch)
    query_env = {**dockerfile.env, **{k: str(v) for k, v in services["query"].get("environment", {}).items()}}
    query = parse_versiq(services["query"]["command"], query_env, monkeypatch)

    # Both services share the named volume at the image's VOLUME, and use it as the warehouse.
    for service, args in ((services["ingest"], ingest), (services["query"], query)):
        mounts = _named_mounts(service)
        assert mounts.get(dockerfile.volumes[0]) == "warehouse"
        assert args.warehouse == dockerfile.volumes[0]

    # The query service publishes the port it listens on, which the image EXPOSEs.
    container_ports = {str(p).rsplit(":", 1)[-1].split("/")[0] for p in services["query"]["ports"]}
    assert container_ports == {str(query.port)} == {p.split("/")[0] for p in dockerfile.expose}

    # The image's HEALTHCHECK probes HTTP: the ingest container must not inherit it.
    assert services["ingest"].get("healthcheck", {}).get("disable") is True


def test_compose_pipeline_file_is_mounted_and_valid(
    compose: dict, dockerfile: Dockerfile, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = compose["services"]["ingest"]
    args = parse_versiq(service["command"], dockerfile.env, monkeypatch)
    mounts = _named_mounts(service)
    source = mounts.get(args.config)
    assert source, f"{args.config} is not mounted into the ingest service"
    pipeline = yaml.safe_load((ROOT / source).read_text(encoding="utf-8"))
    choices = {a.dest: a.choices for a in _subparser("ingest")._actions if a.choices}
    assert pipeline["stores"], "the example pipeline defines no store"
    for store in pipeline["stores"]:
        assert is_valid_store_name(store["name"])
        assert any(
            store["source"] == target or store["source"].startswith(target.rstrip("/") + "/")
            for target in mounts
        ), f"source {store['source']} is not on a volume of the ingest service"
        assert store.get("format", "jsonl") in choices["format"]
        assert store.get("kind", "versioned") in choices["kind"]
        parse_duration_ms(store.get("history_retention", "1d"))


def test_compose_s3_variant_writes_and_serves_one_bucket(
    compose: dict, dockerfile: Dockerfile, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ``s3`` profile: an S3 server creating the bucket, an ingest writing it and query
    replicas reading it, all with the same endpoint and credentials (what it runs is tested
    outside a container by tests/e2e/test_s3_warehouse.py, against the same server)."""
    services = compose["services"]
    assert all(services[n].get("profiles") == ["s3"] for n in ("s3", "ingest-s3", "query-s3"))
    assert all("profiles" not in services[n] for n in ("ingest", "query"))
    server = services["s3"]
    flags = dict(f.lstrip("-").split("=", 1) for f in server["command"][1:])
    assert server["command"][0] == "mini" and server["entrypoint"] == ["/usr/bin/weed"]
    parsed = {}
    for name in ("ingest-s3", "query-s3"):
        env = {**dockerfile.env, **{k: str(v) for k, v in services[name]["environment"].items()}}
        args = parse_versiq(services[name]["command"], env, monkeypatch)
        parsed[name] = args
        assert args.warehouse == "s3://" + flags["bucket"] + "/warehouse"
        assert env["AWS_ENDPOINT_URL"] == f"http://s3:{flags['s3.port']}"
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            assert env[key] == str(server["environment"][key])
        assert "s3" in services[name]["depends_on"]
        assert _named_mounts(services[name]).get(dockerfile.volumes[0]) is None  # no local warehouse
    assert parsed["ingest-s3"].command == "ingest" and parsed["ingest-s3"].continuous
    assert parsed["query-s3"].command == "serve"
    assert services["query-s3"]["deploy"]["replicas"] >= 2
    assert services["query-s3"]["environment"]["VERSIQ_TOKEN_SECRET"]  # replicas share page tokens
    assert "s3data" in compose["volumes"]


# ------------------------------------------------------------------------------ it starts



@dataclass
class Server:
    process: subprocess.Popen[bytes]
    port: int
    stderr: Path
    env: dict[str, str]


@pytest.fixture(scope="module")
def image_server(dockerfile: Dockerfile, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The image's ENTRYPOINT + CMD with its ENV, on an empty warehouse and a free port."""
    tmp = tmp_path_factory.mktemp("container")
    warehouse = tmp / "warehouse"
    warehouse.mkdir()
    port = free_ports(1)[0]
    script = Path(sys.executable).with_name(dockerfile.entrypoint[0])
    entry = [str(script)] if script.exists() else [sys.executable, "-m", "versiq.cli"]
    argv = [*entry, *dockerfile.entrypoint[1:], *dockerfile.cmd,
            "--warehouse", str(warehouse), "--port", str(port)]
    env = {**os.environ, **dockerfile.env, "VERSIQ_PORT": str(port)}
    stderr = tmp / "stderr.log"
    with open(stderr, "wb") as err:
        process = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL, stderr=err, cwd=tmp)
    server = Server(process, port, stderr, env)
    try:
        deadline = time.monotonic() + 60
        last = "no answer"
        while True:
            if process.poll() is not None:
                pytest.fail(f"`{shlex.join(argv)}` exited with {process.returncode}:\n"
                            f"{stderr.read_text(errors='replace')[-3000:]}")
            try:
                response = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
                if response.status_code == 200:
                    break
                last = f"status {response.status_code}"
            except httpx.HTTPError as exc:
                last = repr(exc)
            if time.monotonic() > deadline:
                pytest.fail(f"/healthz did not answer 200 within 60 s ({last}):\n"
                            f"{stderr.read_text(errors='replace')[-3000:]}")
            time.sleep(0.25)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15)


def test_image_default_command_starts_and_is_healthy(image_server: Server) -> None:
    response = httpx.get(f"http://127.0.0.1:{image_server.port}/healthz", timeout=5)
    assert response.status_code == 200


def test_image_healthcheck_passes_on_an_empty_warehouse(
    dockerfile: Dockerfile, image_server: Server
) -> None:
    # A container over a fresh (empty) warehouse volume is ready: it serves no stores yet.
    result = subprocess.run(
        [sys.executable if dockerfile.healthcheck[0] == "python3" else dockerfile.healthcheck[0],
         *dockerfile.healthcheck[1:]],
        env=image_server.env, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr


def test_image_logs_are_json_lines(image_server: Server) -> None:
    httpx.get(f"http://127.0.0.1:{image_server.port}/healthz", timeout=5)
    time.sleep(0.5)
    lines = [line for line in image_server.stderr.read_text(errors="replace").splitlines() if line.strip()]
    assert lines, "the service logged nothing (expected at least its start-up line)"
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            pytest.fail(f"--log-format json printed a line that is not JSON: {line!r}")
        assert isinstance(record, dict) and "level" in record and "msg" in record, line


def test_dockerfile_ships_deltas_spark_connector(dockerfile: Dockerfile) -> None:
    """The image's ingest writes through delta-spark: the jars of jars/pom.xml are fetched in a
    build stage and found through VERSIQ_SPARK_JARS (versiq.ingest.spark)."""
    from versiq.ingest.spark import JARS_DIR_ENV

    text = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    assert "COPY jars/pom.xml" in text and "dependency:copy-dependencies" in text
    target = dockerfile.env[JARS_DIR_ENV]
    assert any(copy[0] == "--from=jars" and copy[-1] == target for copy in dockerfile.copies)
