"""Errors of an ingest that are the user's to fix: found before any data is touched (exit 2)."""

from __future__ import annotations


class UsageError(Exception):
    """A configuration or usage error found before any data is touched (exit status 2)."""


class LockTimeout(Exception):
    """Another writer holds the store's lock (a local lock file, or the lease object of a store
    on S3: ``versiq.ingest.lease``) and did not let go within the wait allowed."""
