"""Store names: validated before any path is built from them (docs/contract.md, Stores on disk)."""

from __future__ import annotations

import difflib
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


#: Up to this many names, a message about an unknown one lists them all.
LIST_AT_MOST = 8


def unknown_name(kind: str, name: str, known: list[str], where: str = "the warehouse") -> str:
    """The one wording of "there is no ``kind`` ``name``": ``no store 'pricse' in the warehouse;
    did you mean 'prices'?``, else the names there are when few (``its stores: a, b``), else how
    many. Every command and the HTTP API say it this way."""
    message = f"no {kind} {name!r} in {where}"
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    if close:
        return f"{message}; did you mean {close[0]!r}?"
    if not known:
        return f"{message}; it has no {kind}s"
    if len(known) <= LIST_AT_MOST:
        return f"{message}; its {kind}s: {', '.join(sorted(known))}"
    return f"{message} ({len(known)} {kind}s there)"
