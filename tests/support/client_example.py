"""docs/http-api.md's example of the Python client generated from openapi.yaml (openapi-python-client):
tests/service/test_service_client.py copies it next to the generated ``versiq_client`` package,
checks both with ``mypy --strict`` and runs ``latest_and_history`` against live servers, with
authentication off (a plain ``Client``) and on (an ``AuthenticatedClient``)."""

from versiq_client import AuthenticatedClient, Client
from versiq_client.api.queries import get_key, list_versions
from versiq_client.models import KeyValue, VersionsPage


def latest_and_history(url: str, token: str | None = None) -> tuple[KeyValue, VersionsPage]:
    client = AuthenticatedClient(base_url=url, token=token) if token else Client(base_url=url)
    latest = get_key.sync("prices", "p-1", client=client)  # KeyValue, or a Problem (404, 401, ...)
    history = list_versions.sync("prices", "p-1", client=client, from_="2023-11-14T00:00:00Z", page_size=10)
    if not isinstance(latest, KeyValue) or not isinstance(history, VersionsPage):
        raise RuntimeError(f"no answer: {latest!r} {history!r}")
    print(latest.value, "since", latest.timestamp, [(v.value, v.timestamp, v.valid_to) for v in history.records])
    return latest, history
