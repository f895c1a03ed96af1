"""Which files of a source a run reads: listing, what is ignored, and what fails the run.

A source is a file or a directory walked recursively, or an ``s3://`` object or prefix (every
object under it; ``versiq.storage``: parse tasks read a local copy of each). Names starting with ``.`` or ``_`` are
never sources (at any depth). Only regular files, and symlinks to regular files, are read:
anything else (a FIFO, a socket, a device, a symlink to a directory) is never opened — opening
a FIFO blocks until a writer appears, which once hung an ingest while it held the store's lock —
and is named in the run report and the log as ignored, with its type.

A file or directory that cannot be read (a dangling symlink, a symlink loop, a permission
error, an I/O error) is an error of the *run*, not of a record: the store's run fails with a
message naming the path and the OS error, nothing of it is committed, and the next run retries
the file. Turning it into a rejected record would mark the file done and lose it for good once
it became readable.
"""

from __future__ import annotations

import logging
import os
import re
import stat
from dataclasses import dataclass, field

log = logging.getLogger("versiq.ingest")


class SourceError(Exception):
    """A source file or directory cannot be read: the store's run fails and commits nothing.
    The message names the path and the OS error (one line, no traceback)."""


@dataclass
class SourceListing:
    #: Relative path (``/``-separated) -> absolute path of every regular file, sorted by
    #: relative path in code point order (the processing order of files, docs/semantics.md, rules 19-21).
    files: dict[str, str] = field(default_factory=dict)
    #: Entries that are not regular files: ``{"path": relative path, "type": "fifo"|...}``.
    ignored: list[dict[str, str]] = field(default_factory=list)


def hidden_name(name: str) -> bool:
    """Whether a file or folder name is hidden from listings (``.`` or ``_`` first): never a
    source, never entered."""
    return name.startswith((".", "_"))


def _kind(mode: int) -> str | None:
    """The type name of a non-regular file (None for a regular one)."""
    if stat.S_ISREG(mode):
        return None
    for test, name in ((stat.S_ISFIFO, "fifo"), (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISDIR, "directory")):
        if test(mode):
            return name
    return "unknown file type"


def _classify(listing: SourceListing, rel: str, full: str) -> None:
    try:
        mode = os.stat(full).st_mode  # follows symlinks: a symlink to a regular file is a file
    except OSError as exc:
        raise SourceError(f"cannot read source file {full}: {exc.strerror or exc}") from None
    kind = _kind(mode)
    if kind is None:
        listing.files[rel] = full
    else:
        if os.path.islink(full):
            kind = f"symlink to {kind}"
        listing.ignored.append({"path": rel, "type": kind})


def list_sources(source: str) -> SourceListing:
    """Every file of ``source`` (see the module docstring); raises ``SourceError`` when a file
    or directory of it cannot be read."""
    if _is_s3(source):
        return _list_s3(source)
    source = os.path.abspath(source)
    listing = SourceListing()
    if not os.path.isdir(source):
        name = os.path.basename(source)
        if not hidden_name(name):
            _classify(listing, name, source)
        return listing

    def unreadable(exc: OSError) -> None:
        raise SourceError(f"cannot read source directory {exc.filename}: {exc.strerror or exc}")

    for folder, dirs, files in os.walk(source, onerror=unreadable):
        # os.walk lists a symlink to a directory among ``dirs`` and does not enter it
        for name in sorted(dirs):
            full = os.path.join(folder, name)
            if not hidden_name(name) and os.path.islink(full):
                listing.ignored.append({"path": os.path.relpath(full, source).replace(os.sep, "/"),
                                        "type": "symlink to directory"})
        dirs[:] = sorted(d for d in dirs if not hidden_name(d) and not os.path.islink(os.path.join(folder, d)))
        for name in files:
            if not hidden_name(name):
                full = os.path.join(folder, name)
                _classify(listing, os.path.relpath(full, source).replace(os.sep, "/"), full)
    listing.files = dict(sorted(listing.files.items()))
    listing.ignored.sort(key=lambda entry: entry["path"])
    return listing


def _is_s3(path: str) -> bool:
    """``versiq.storage.is_s3``, imported only for a URI: local listing needs only the standard
    library (a test runs it as another user, from a copy of this file)."""
    if "://" not in path:
        return False
    from versiq import storage

    return storage.is_s3(path)


def _list_s3(source: str) -> SourceListing:
    """The objects under an ``s3://`` source prefix (or the one object it names), hidden names
    (a path component starting with ``.`` or ``_``) left out, in key order. S3 has only objects:
    nothing is ever ignored. A listing the server refuses fails the run."""
    from versiq import storage

    try:
        found = storage.list_files(source)
    except OSError as exc:
        raise SourceError(f"cannot list source {source}: {exc}") from None
    if found is None:
        raise SourceError(f"source {source} has no objects")
    files = {rel: full for rel, full in found.items() if not any(hidden_name(p) for p in rel.split("/"))}
    return SourceListing(files=files)


def read_error(path: str, exc: OSError) -> SourceError:
    """The run's error for a read of ``path`` the OS refused (raised by the parse, in a Spark
    task or in the run's own process, whose OSError alone does not say which file)."""
    return SourceError(f"cannot read source file {path}: {exc.strerror or exc}")


_IN_TASK = re.compile(r"SourceError: (.+)")


def source_error_in(exc: BaseException) -> SourceError | None:
    """The ``SourceError`` a Spark task raised, out of the driver-side exception that carries
    the task's traceback as text (so the report gets one line, not a traceback)."""
    found = _IN_TASK.findall(str(exc))
    return SourceError(found[-1].strip()) if found else None


def check_readable(files: dict[str, str]) -> int | None:
    """Open every file about to be read (non-blocking, so a file replaced by a FIFO since the
    listing cannot hang the run): a file that cannot be opened fails the run on the driver, with
    a clear message, before any Spark work. The parse re-raises read errors as well (the only
    check for S3 objects, which the listing has just seen and which cannot be FIFOs).
    Returns the files' bytes (``spark.plans_for_input``), None when some are S3 objects."""
    total: int | None = 0
    for full in files.values():
        if _is_s3(full):
            total = None
            continue
        try:
            fd = os.open(full, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as exc:
            raise SourceError(f"cannot read source file {full}: {exc.strerror or exc}") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise SourceError(f"source file {full} is no longer a regular file")
            if total is not None:
                total += info.st_size
        finally:
            os.close(fd)
    return total


def log_ignored(what: str, name: str, ignored: list[dict[str, str]]) -> list[dict[str, str]]:
    """Name every ignored source entry in the log (a warning: it may be a mistake), once per run."""
    for entry in ignored:
        log.warning("%s %s: ignored %s (a %s, not a regular file)", what, name, entry["path"], entry["type"])
    return ignored
