"""The ``schema_registry`` fixture is a real Confluent-compatible schema registry (Apicurio Registry,
tests/support/schema_registry.py): a schema registered for a subject through the ccompat API reads
back by the id it was given, an unknown id is a 404, ids survive a restart (and a SIGKILL), it
listens on 127.0.0.1 only, and closing it leaves no process and no directory behind."""

from __future__ import annotations

import json
import os
import socket

import httpx
import pytest

from tests.support.schema_registry import CCOMPAT_PATH, SchemaRegistry, SchemaRegistryError

AVRO = {"type": "record", "name": "Price", "namespace": "versiq.test",
        "fields": [{"name": "sku", "type": "string"}, {"name": "cents", "type": "long"},
                   {"name": "note", "type": ["null", "string"], "default": None}]}


def test_avro_schema_registers_and_reads_back_by_id(schema_registry):
    assert schema_registry.url == f"http://127.0.0.1:{schema_registry.port}{CCOMPAT_PATH}"
    subject = "prices-value"
    schema_id = schema_registry.register(subject, AVRO)
    assert schema_id > 0
    got = schema_registry.schema(schema_id)
    assert json.loads(got["schema"]) == AVRO
    assert got.get("schemaType", "AVRO") == "AVRO"
    assert subject in schema_registry.subjects()
    assert schema_registry.versions(subject) == [1]
    # The same schema again under the same subject: the same id (Confluent's semantics).
    assert schema_registry.register(subject, AVRO) == schema_id
    # A plain HTTP client sees the same (what versiq's reader will do).
    response = httpx.get(f"{schema_registry.url}/schemas/ids/{schema_id}", timeout=10)
    assert response.status_code == 200 and json.loads(response.json()["schema"]) == AVRO


def test_json_schema_registers_and_unknown_id_is_404(schema_registry):
    schema = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
              "properties": {"sku": {"type": "string"}}}
    schema_id = schema_registry.register("json-value", schema, schema_type="JSON")
    got = schema_registry.schema(schema_id)
    assert json.loads(got["schema"]) == schema and got["schemaType"] == "JSON"
    response = httpx.get(f"{schema_registry.url}/schemas/ids/987654", timeout=10)
    assert response.status_code == 404
    with pytest.raises(SchemaRegistryError, match="HTTP 404"):
        schema_registry.schema(987654)


def test_own_registry_keeps_ids_across_restart_and_kill_and_cleans_up():
    registry = SchemaRegistry()
    work_dir = registry.work_dir
    try:
        registry.start()
        schema_id = registry.register("restart-value", AVRO)
        registry.restart()
        assert json.loads(registry.schema(schema_id)["schema"]) == AVRO
        registry.restart(hard=True)
        assert json.loads(registry.schema(schema_id)["schema"]) == AVRO
        # 127.0.0.1 only: the port is not open on another local address of the machine.
        addresses = {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)}
        for address in addresses - {"127.0.0.1"}:
            if address.startswith("127."):
                continue
            with pytest.raises(OSError), socket.create_connection((address, registry.port), timeout=2):
                pass
        pid = registry.pid
        assert pid is not None
    finally:
        registry.close()
    assert not registry.is_running()
    assert not work_dir.exists()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
