"""Service configuration, read from the environment (the container) or built by tests.

Environment variables (declared, parsed and documented in ``versiq.settings``):

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

import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field

from versiq import settings as registry
from versiq.service.bodies import MAX_BUFFERED_BODY_BYTES

DEFAULT_TOKEN_TTL_S = registry.PAGE_TOKEN_TTL.default

#: A configuration value is unusable; the message names it. One error for the registry's
#: variables and the settings the service checks itself (a warehouse, a token file).
ConfigError = registry.SettingError


@dataclass(frozen=True)
class Settings:
    warehouse: str
    refresh_interval_s: float = registry.REFRESH_INTERVAL.default
    watch_interval_s: float | None = None  # None: the engine's default for the warehouse
    token_secret: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)
    token_ttl_s: float = DEFAULT_TOKEN_TTL_S
    api_tokens: frozenset[str] | None = field(default=None, repr=False)
    cors_origins: tuple[str, ...] = ()
    #: Bytes of request bodies buffered at once over all requests (``service.bodies``).
    body_budget_bytes: int = MAX_BUFFERED_BODY_BYTES

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """The settings of ``env`` (default: this process's environment); raises ``ConfigError``
        for a missing warehouse or any unusable value (``versiq serve`` checks before it forks)."""
        warehouse = registry.WAREHOUSE.value(env)
        if not warehouse:
            raise ConfigError(f"{registry.WAREHOUSE.name} is not set: name the warehouse directory")
        secret = registry.TOKEN_SECRET.value(env)
        return cls(
            warehouse=warehouse,
            refresh_interval_s=registry.REFRESH_INTERVAL.value(env),
            watch_interval_s=registry.WATCH_INTERVAL.value(env),
            token_secret=secret.encode("utf-8") if secret else secrets.token_bytes(32),
            token_ttl_s=registry.PAGE_TOKEN_TTL.value(env),
            api_tokens=_api_tokens(env),
            cors_origins=registry.CORS_ORIGINS.value(env),
        )


def _api_tokens(env: Mapping[str, str] | None) -> frozenset[str] | None:
    tokens: set[str] = set()
    enabled = False
    inline = registry.API_TOKENS.value(env)
    if inline:
        enabled = True
        tokens.update(registry.comma_list(inline))
    path = registry.API_TOKENS_FILE.value(env)
    if path:
        enabled = True
        try:
            with open(path, encoding="utf-8") as fh:
                for line in fh:
                    line = line.strip()
                    if line and not line.startswith("#"):
                        tokens.add(line)
        except OSError as exc:
            raise ConfigError(f"{registry.API_TOKENS_FILE.name}: cannot read {path}: {exc}") from None
    if enabled and not tokens:
        raise ConfigError(f"{registry.API_TOKENS.name} / {registry.API_TOKENS_FILE.name} name no token")
    return frozenset(tokens) if enabled else None
