"""A real Confluent-compatible schema registry for the tests: Apicurio Registry's JVM distribution
(a Quarkus runner jar and its ``lib/``) from ``tests/schema-registry/pom.xml``, which ``make``
unpacks into ``.cache/schema-registry`` (``make .cache/schema-registry/.fetched``), run as a Java
subprocess. Its Confluent-compatible REST API (``/subjects``, ``/schemas/ids/{id}``, ...) is under
``/apis/ccompat/v7``: ``url`` is that base URL, the one a Confluent client is given.

It listens on 127.0.0.1 only, on a free port chosen once, and keeps its schemas in an H2 database
file in a temporary directory (with its log, ``registry.log``): a ``restart()`` keeps the port and
every schema id, so a test can take the registry away in the middle of an ingest run and bring it
back. It is stopped at interpreter exit whatever happens to the test that started it.

    registry = SchemaRegistry()
    registry.start()                                  # ~5-15 s (a Quarkus application)
    schema_id = registry.register("t-value", {"type": "record", "name": "R", "fields": [...]})
    registry.schema(schema_id)                        # {"schema": "...", "references": []}
    registry.stop()
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

import httpx

from tests.support.processes import java_binary
from tests.support.server_process import ServerProcess, free_ports

ROOT = Path(__file__).resolve().parents[2]
DIST_DIR = ROOT / ".cache" / "schema-registry"
APICURIO_VERSION = "2.6.13.Final"  # tests/schema-registry/pom.xml
FETCH_HINT = ("run `make .cache/schema-registry/.fetched` (make test does it) to fetch the schema "
              "registry (Apicurio Registry)")
CCOMPAT_PATH = "/apis/ccompat/v7"
CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


class SchemaRegistryError(RuntimeError):
    """The registry could not be started, or a request to it failed."""


def runner_jar(dist_dir: Path = DIST_DIR) -> Path:
    return dist_dir / f"apicurio-registry-app-{APICURIO_VERSION}-runner.jar"


def dist_present(dist_dir: Path = DIST_DIR) -> bool:
    """Whether the registry's distribution has been unpacked into ``dist_dir``."""
    return runner_jar(dist_dir).is_file() and (dist_dir / "lib").is_dir()


class SchemaRegistry(ServerProcess):
    """One Apicurio Registry on 127.0.0.1, reached through its Confluent-compatible API.

    ``start()``/``stop()``/``kill()``/``restart()`` manage the process; ``url`` is the
    Confluent-compatible base URL; ``register``, ``schema``, ``subjects`` and ``versions`` talk to
    it. Every wait has a timeout, and every error carries the tail of the registry's log.
    """

    error = SchemaRegistryError
    what = "schema registry"
    start_timeout = 120.0
    stop_timeout = 30.0

    def __init__(self, dist_dir: Path | str = DIST_DIR, *, work_dir: Path | str | None = None,
                 heap: str = "384m") -> None:
        super().__init__(work_dir, dir_prefix="versiq-registry-", log_name="registry.log")
        self.dist_dir = Path(dist_dir)
        self.heap = heap
        (self.port,) = free_ports(1)
        self.db_file = self.work_dir / "db" / "registry"

    # -- addresses -----------------------------------------------------------------------------

    @property
    def root(self) -> str:
        """``http://127.0.0.1:PORT``: the server's root (health checks under ``/health``)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """The Confluent-compatible base URL (what ``schema.registry.url`` is set to)."""
        return self.root + CCOMPAT_PATH

    # -- process -------------------------------------------------------------------------------

    def command(self) -> list[str]:
        settings = {
            "quarkus.http.host": "127.0.0.1",
            "quarkus.http.port": str(self.port),
            # H2 in a file: a restart keeps the schemas and their ids (the default is in memory).
            "quarkus.datasource.jdbc.url": f"jdbc:h2:file:{self.db_file}",
            # A connection pool of 20 (prod's default) is more than a test needs.
            "quarkus.datasource.jdbc.initial-size": "1",
            "quarkus.datasource.jdbc.min-size": "1",
            "quarkus.log.console.color": "false",
        }
        # The application's own properties set these under the prod profile (%prod.): the same keys
        # with and without it, so they win whichever way the configuration resolves profiles.
        flags = [f"-D{prefix}{key}={value}" for key, value in settings.items() for prefix in ("", "%prod.")]
        return [java_binary(SchemaRegistryError), f"-Xmx{self.heap}", "-Xms64m", "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
                "-Djava.awt.headless=true", "-Djava.net.preferIPv4Stack=true", *flags,
                "-jar", str(runner_jar(self.dist_dir))]

    def environment(self) -> dict[str, str]:
        # Variables the application's properties read (HTTP_PORT, REGISTRY_*, ...) must not come
        # from the developer's environment.
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("REGISTRY_", "QUARKUS_", "HTTP_", "KAFKA_", "ENABLE_", "CORS_"))}
        env["HTTP_PORT"] = str(self.port)
        return env

    def _prepare(self, timeout: float) -> None:
        if not dist_present(self.dist_dir):
            raise SchemaRegistryError(f"no schema registry in {self.dist_dir}: {FETCH_HINT}")
        self.db_file.parent.mkdir(parents=True, exist_ok=True)

    def _wait_ready(self, deadline: float) -> None:
        # First the port, then the readiness check (storage up) and one call of the ccompat API.
        last: Exception | str | None = None
        while True:
            if not self.is_running():
                raise self._exited_error()
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    pass
                ready = httpx.get(self.root + "/health/ready", timeout=5)
                if ready.status_code == 200 and ready.json().get("status") == "UP":
                    self.subjects()
                    return
                last = f"readiness {ready.status_code}: {ready.text[:200]}"
            except Exception as exc:  # not up yet
                last = exc
            if time.monotonic() > deadline:
                raise self._error(f"the schema registry did not become ready in time (last: {last})")
            time.sleep(0.25)

    # -- the Confluent-compatible API -------------------------------------------------------------

    def _request(self, method: str, path: str, body: Any = None, timeout: float = 30.0) -> Any:
        try:
            response = httpx.request(method, self.url + path, timeout=timeout,
                                     headers={"Content-Type": CONTENT_TYPE, "Accept": CONTENT_TYPE},
                                     content=None if body is None else json.dumps(body))
        except httpx.HTTPError as exc:
            raise self._error(f"{method} {path} failed: {exc}") from exc
        if response.status_code >= 300:
            raise SchemaRegistryError(f"{method} {path}: HTTP {response.status_code}: {response.text[:500]}")
        return response.json()

    def register(self, subject: str, schema: Any, schema_type: str = "AVRO",
                 references: list[dict[str, Any]] | None = None) -> int:
        """Register ``schema`` (a JSON-able object or its text) under ``subject`` and return its
        id, the one the Confluent wire format carries. ``schema_type``: AVRO, JSON or PROTOBUF;
        ``references``: ``[{"name": ..., "subject": ..., "version": ...}]`` (for Protobuf the
        name is the import path)."""
        text = schema if isinstance(schema, str) else json.dumps(schema)
        body: dict[str, Any] = {"schema": text}
        if schema_type != "AVRO":
            body["schemaType"] = schema_type
        if references:
            body["references"] = references
        return int(self._request("POST", f"/subjects/{subject}/versions", body)["id"])

    def schema(self, schema_id: int) -> dict[str, Any]:
        """``GET /schemas/ids/{id}``: ``{"schema": text, "references": [...]}`` (and
        ``schemaType`` unless Avro)."""
        result: dict[str, Any] = self._request("GET", f"/schemas/ids/{schema_id}")
        return result

    def subjects(self) -> list[str]:
        return list(self._request("GET", "/subjects"))

    def versions(self, subject: str) -> list[int]:
        return [int(v) for v in self._request("GET", f"/subjects/{subject}/versions")]
