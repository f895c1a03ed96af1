"""Errors of an ingest that are the user's to fix (exit 2), and the writer lock's (exit 1): each is
explained in one line, never with a traceback."""

from __future__ import annotations

import re


class UsageError(Exception):
    """A configuration or usage error found before any data is touched (exit status 2)."""


class LockTimeout(Exception):
    """Another writer holds the store's lock (a local lock file, or the lease object of a store
    on S3: ``versiq.ingest.lease``) and did not let go within the wait allowed."""


class LeaseLost(Exception):
    """This writer's lease of a store on S3 (``versiq.ingest.lease``) was taken over, deleted, or
    not renewed within its ttl: the writer must not commit (if it did, the commit protocol would
    refuse a conflicting commit). The run fails, naming the store and why (one line)."""


class StorageFailed(Exception):
    """A warehouse on S3 failed a run's write or read through Hadoop's S3A (the server went away,
    refused the request, or kept failing within S3A's bounded retries, ``ingest.spark.S3A_BOUNDS``):
    the run fails, commits nothing (a rerun completes it), and says so in one line."""


#: What the environment or another writer can do to a writer (another writer holds the store, the
#: lease was lost, S3 failed): reported in one line, never with a traceback (that is for defects).
WRITER_FAILURES: tuple[type[Exception], ...] = (LockTimeout, LeaseLost, StorageFailed)


#: An S3A or AWS SDK exception of a Java failure's text (which carries the Java stack): a line
#: (or a "Caused by:", or a message's ": ...") that starts with its class, never a stack frame.
_S3_ERROR = re.compile(r"(?:^|Caused by: |: )((?:org\.apache\.hadoop\.fs\.s3a|software\.amazon\.awssdk)\.[\w.$]*"
                       r"(?:Exception|Error)(?::[^\n]*)?)$", re.MULTILINE)


def storage_error_in(exc: BaseException) -> StorageFailed | None:
    """The one-line ``StorageFailed`` of a Spark or Delta failure caused by S3 (the innermost
    S3A/SDK exception named in its text, the root cause), None for any other failure."""
    found = _S3_ERROR.findall(str(exc))
    return StorageFailed(f"S3 failed: {found[-1].strip()}") if found else None


def one_line(exc: BaseException) -> str:
    """``exc`` as one line: its S3 cause when it has one, else its first line (a Java failure's
    text goes on with its stack)."""
    cause = storage_error_in(exc)
    if cause is not None:
        return str(cause)
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")
