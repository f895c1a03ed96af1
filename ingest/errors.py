"""Errors of an ingest that are the user's to fix: found before any data is touched (exit 2)."""

from __future__ import annotations


class UsageError(Exception):
    """A configuration or usage error found before any data is touched (exit status 2)."""
