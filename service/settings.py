"""Service configuration, read from the environment (the container) or built by tests.

Environment variables:

- ``VERSIQ_WAREHOUSE``: warehouse directory (required).
- ``VERSIQ_REFRESH_INTERVAL``: how often the engine looks for new, removed and failing stores
  (a full pass; duration, default 1s).
- ``VERSIQ_WATCH_INTERVAL``: how often it checks whether the next commit of each store it serves
  has landed (duration; default 100ms, 500ms for a warehouse on S3, where a check is a HEAD). In
  a local warehouse the kernel's file notifications also start that check as soon as a commit
  file is written.
- ``VERSIQ_TOKEN_SECRET``: HMAC secret for page tokens. Unset: random per process, so set it
  whenever more than one process (workers, replicas) serves one address.
- ``VERSIQ_PAGE_TOKEN_TTL``: page-token lifetime (duration: ``3600000``, ``1h``, ``PT1H``; default 1h).
- ``VERSIQ_API_TOKENS`` (comma-separated) / ``VERSIQ_API_TOKENS_FILE`` (one token per line, ``#``
  comments): enable bearer-token auth; off when both are unset.
- ``VERSIQ_CORS_ORIGINS``: comma-separated allowed origins (``*`` for any); CORS off when unset.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from versiq.durations import parse_duration_ms
from versiq.service.bodies import MAX_BUFFERED_BODY_BYTES

DEFAULT_TOKEN_TTL_S = 3600.0
_D = TypeVar("_D", float, None)


class ConfigError(ValueError):
    """A configuration value is unusable; the message names it."""


@dataclass(frozen=True)
class Settings:
    warehouse: str
    refresh_interval_s: float = 1.0
    watch_interval_s: float | None = None  # None: the engine's default for the warehouse
    token_secret: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)
    token_ttl_s: float = DEFAULT_TOKEN_TTL_S
    api_tokens: frozenset[str] | None = field(default=None, repr=False)
    cors_origins: tuple[str, ...] = ()
    #: Bytes of request bodies buffered at once over all requests (``service.bodies``).
    body_budget_bytes: int = MAX_BUFFERED_BODY_BYTES

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        warehouse = env.get("VERSIQ_WAREHOUSE")
        if not warehouse:
            raise ConfigError("VERSIQ_WAREHOUSE is not set: name the warehouse directory")
        secret = env.get("VERSIQ_TOKEN_SECRET")
        return cls(
            warehouse=warehouse,
            refresh_interval_s=_duration_s(env, "VERSIQ_REFRESH_INTERVAL", 1.0),
            watch_interval_s=_duration_s(env, "VERSIQ_WATCH_INTERVAL", None),
            token_secret=secret.encode("utf-8") if secret else secrets.token_bytes(32),
            token_ttl_s=_duration_s(env, "VERSIQ_PAGE_TOKEN_TTL", DEFAULT_TOKEN_TTL_S),
            api_tokens=_api_tokens(env),
            cors_origins=tuple(
                o.strip() for o in env.get("VERSIQ_CORS_ORIGINS", "").split(",") if o.strip()
            ),
        )


def _duration_s(env: Mapping[str, str], name: str, default: _D) -> float | _D:
    text = env.get(name)
    if not text:
        return default
    try:
        return parse_duration_ms(text) / 1000
    except ValueError as exc:
        raise ConfigError(f"{name}: {exc}") from None


def _api_tokens(env: Mapping[str, str]) -> frozenset[str] | None:
    tokens: set[str] = set()
    enabled = False
    inline = env.get("VERSIQ_API_TOKENS")
    if inline:
        enabled = True
        tokens.update(t.strip() for t in inline.split(",") if t.strip())
    path = env.get("VERSIQ_API_TOKENS_FILE")
    if path:
        enabled = True
        try:
            with open(path, encoding="utf-8") as fh:
                for line in fh:
                    line = line.strip()
                    if line and not line.startswith("#"):
                        tokens.add(line)
        except OSError as exc:
            raise ConfigError(f"VERSIQ_API_TOKENS_FILE: cannot read {path}: {exc}") from None
    if enabled and not tokens:
        raise ConfigError("VERSIQ_API_TOKENS / VERSIQ_API_TOKENS_FILE name no token")
    return frozenset(tokens) if enabled else None
