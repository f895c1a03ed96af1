"""Store names: validated before any path is built from them (docs/contract.md, Stores on disk)."""

from __future__ import annotations

import re

_STORE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}\Z")


def is_valid_store_name(name: str) -> bool:
    """True for ``^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$`` names without ``..``."""
    return bool(_STORE_NAME.match(name)) and ".." not in name


def check_store_name(name: str) -> str:
    """Return ``name`` or raise ValueError with a message fit for a user."""
    if not is_valid_store_name(name):
        raise ValueError(
            f"invalid store name {name!r}: use 1-100 letters, digits, '_', '-' or '.', "
            "starting with a letter or digit, without '..'"
        )
    return name
