"""Where a warehouse lives: a local directory (the embedded default) or a prefix in an S3 bucket
(``s3://bucket/prefix``, also written ``s3a://``). Every path versiq builds for a
table, a Delta log or a private object goes through this module, so the rest of the code never
asks which of the two it has.

What each side uses, and why:

- **Listing and small reads** (store discovery, the Delta log directory, a commit's JSON):
  ``os`` for a local directory; pyarrow's ``S3FileSystem`` for S3 (the client the project already
  has, with the AWS SDK's credential chain).
- **Delta tables** are read with delta-rs (``delta_table``): a local path as is; for S3 the same
  URI with ``delta_options()`` (endpoint, region, plain HTTP for an ``http://`` endpoint);
  credentials come from the standard variables delta-rs reads itself.
- **Parquet through DuckDB**: DuckDB 2.0's ``httpfs`` extension cannot be installed offline and
  no build for 2.0 is on PyPI (docs/research/s3-warehouse.md, section 4), so ``duckdb_connect``
  registers pyarrow's S3 file system with DuckDB through fsspec (``ArrowFSWrapper``): every
  ``read_parquet($files)`` of the code then reads ``s3://`` URIs as it reads local paths, with
  DuckDB's projection and row-group pruning (ranged GETs).
- **Writes** are Spark's (``s3a://`` through Hadoop's S3A and versiq's conditional-put LogStore,
  ``versiq.ingest.spark``); the one object versiq writes itself, the writer's lease
  (``versiq.ingest.lease``), needs S3's conditional puts, which only boto3 offers (``s3_client``).

Configuration is the standard AWS variables only: ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``
(an S3-compatible server: path-style requests), ``AWS_REGION`` or ``AWS_DEFAULT_REGION``, and the
credentials (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``, profiles,
instance roles), which versiq never reads, logs or shows: each client's own provider chain does.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import posixpath
import shutil
import tempfile
import threading
import urllib.parse
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import duckdb

if TYPE_CHECKING:
    from deltalake import DeltaTable
    from pyarrow import fs as pafs

S3_SCHEMES = ("s3", "s3a")
DEFAULT_REGION = "us-east-1"
#: Timeouts of versiq's own S3 requests (listing, small reads, delta-rs, DuckDB's reads): a dead
#: endpoint fails a run or a refresh in seconds instead of hanging it.
CONNECT_TIMEOUT_S = 5.0
REQUEST_TIMEOUT_S = 30.0
#: DuckDB connections never try to download an extension (these machines cannot, and a failed
#: attempt costs ~6 s on the first setting that would have loaded one).
DUCKDB_OFFLINE = {"autoinstall_known_extensions": "false", "autoload_known_extensions": "false"}


class StorageError(OSError):
    """A warehouse location that cannot be used (bad URI, missing configuration)."""


# ------------------------------------------------------------------------------ paths

def is_s3(path: str) -> bool:
    """Whether ``path`` is an ``s3://`` or ``s3a://`` URI."""
    scheme, sep, _ = path.partition("://")
    return bool(sep) and scheme.lower() in S3_SCHEMES


def normalize(path: str) -> str:
    """The canonical form of a warehouse or table location: an absolute local path, or
    ``s3://bucket/prefix`` (``s3a://`` becomes ``s3://``; no trailing slash). A URI of another
    scheme, or an S3 URI without a bucket or with credentials in it, is a ``StorageError``."""
    if "://" not in path:
        return os.path.abspath(path)
    if not is_s3(path):
        raise StorageError(f"unsupported warehouse location {path!r}: a local directory or s3://bucket/prefix")
    parsed = urllib.parse.urlsplit(path)
    if parsed.username or parsed.password:
        raise StorageError("an s3:// location must not carry credentials: use the AWS_* variables")
    if not parsed.hostname:
        raise StorageError(f"{path!r} names no bucket: use s3://bucket/prefix")
    key = parsed.path.strip("/")
    return f"s3://{parsed.netloc}/{key}" if key else f"s3://{parsed.netloc}"


def join(base: str, *parts: str) -> str:
    """``base`` joined with ``parts`` (``/`` inside an S3 URI, the OS's separator locally)."""
    if is_s3(base):
        return "/".join([base.rstrip("/"), *(p.strip("/") for p in parts)])
    return os.path.join(base, *parts)


def basename(path: str) -> str:
    return posixpath.basename(path.rstrip("/")) if is_s3(path) else os.path.basename(path)


def split_s3(uri: str) -> tuple[str, str]:
    """``(bucket, key)`` of an S3 URI (key without a leading slash)."""
    parsed = urllib.parse.urlsplit(uri)
    return parsed.netloc, parsed.path.lstrip("/")


def _fs_path(uri: str) -> str:
    """The ``bucket/key`` form pyarrow's S3 file system takes."""
    bucket, key = split_s3(uri)
    return f"{bucket}/{key}".rstrip("/")


def data_file(table_path: str, path: str) -> str:
    """The location DuckDB reads for an add action's ``path`` (relative, absolute, a file URL,
    or an ``s3://``/``s3a://`` URI): a local absolute path, or an ``s3://`` URI for a table on S3
    (``_fsspec_s3``)."""
    if is_s3(path):
        return "s3://" + urllib.parse.unquote(path.split("://", 1)[1])
    if "://" in path:
        parsed = urllib.parse.urlparse(path)
        return urllib.parse.unquote(parsed.path)
    if is_s3(table_path):
        return join(table_path, urllib.parse.unquote(path))
    if os.path.isabs(path):
        return path
    return os.path.join(table_path, urllib.parse.unquote(path))


# ------------------------------------------------------------------------------ configuration

def endpoint(environ: Mapping[str, str] | None = None) -> str | None:
    """The S3 endpoint URL of an S3-compatible server, or None for AWS itself."""
    env = os.environ if environ is None else environ
    return env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None


def region(environ: Mapping[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    return env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or DEFAULT_REGION


def delta_options(path: str) -> dict[str, str] | None:
    """delta-rs ``storage_options`` for a table at ``path``: None locally; for S3 the endpoint,
    region and timeouts (and plain HTTP for an ``http://`` endpoint). No credentials: delta-rs
    reads the standard variables itself."""
    if not is_s3(path):
        return None
    options = {"AWS_REGION": region(), "timeout": f"{int(REQUEST_TIMEOUT_S)}s",
               "connect_timeout": f"{int(CONNECT_TIMEOUT_S)}s"}
    url = endpoint()
    if url:
        options["AWS_ENDPOINT_URL"] = url
        if url.lower().startswith("http://"):
            options["AWS_ALLOW_HTTP"] = "true"
    return options


def delta_table(path: str, version: int | None = None) -> DeltaTable:
    """The Delta table at ``path`` (its newest version, or ``version``), read with delta-rs."""
    from deltalake import DeltaTable

    return DeltaTable(path, version=version, storage_options=delta_options(path))


#: The longest error line ``error_line`` gives (a corrupt log's error may quote a whole record).
ERROR_LINE_CHARS = 500


def error_line(exc: BaseException) -> str:
    """The message of a storage error as one line, for answers and readiness: the first non-blank
    line of ``str(exc)``, at most ``ERROR_LINE_CHARS`` characters (the exception's type when the
    message is empty). delta-rs appends a Rust backtrace to its messages when ``RUST_BACKTRACE``
    is set, and DuckDB may add context lines: those are for the log, not for an API client."""
    line = next((text.strip() for text in str(exc).splitlines() if text.strip()), type(exc).__name__)
    return line if len(line) <= ERROR_LINE_CHARS else line[: ERROR_LINE_CHARS - 1] + "…"


def is_delta_table(path: str) -> bool:
    from deltalake import DeltaTable

    return bool(DeltaTable.is_deltatable(path, storage_options=delta_options(path)))


_fs_lock = threading.Lock()


@functools.cache
def _s3_filesystem(endpoint_url: str | None, region_name: str) -> pafs.S3FileSystem:
    from pyarrow import fs as pafs

    options: dict[str, Any] = {"region": region_name, "connect_timeout": CONNECT_TIMEOUT_S,
                               "request_timeout": REQUEST_TIMEOUT_S,
                               "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=3)}
    if endpoint_url:
        parsed = urllib.parse.urlsplit(endpoint_url)
        options.update(endpoint_override=parsed.netloc + parsed.path.rstrip("/"), scheme=parsed.scheme or "https",
                       force_virtual_addressing=False)
    return pafs.S3FileSystem(**options)


def s3_filesystem() -> pafs.S3FileSystem:
    """pyarrow's S3 file system for the configured endpoint and region (one per configuration)."""
    with _fs_lock:
        return _s3_filesystem(endpoint(), region())


def s3_client() -> Any:
    """A boto3 S3 client for the configured endpoint and region (path-style for an endpoint):
    the one client that sends conditional puts (``IfNoneMatch``/``IfMatch``)."""
    import boto3
    from botocore.config import Config

    url = endpoint()
    config = Config(connect_timeout=CONNECT_TIMEOUT_S, read_timeout=REQUEST_TIMEOUT_S,
                    retries={"max_attempts": 3, "mode": "standard"},
                    s3={"addressing_style": "path"} if url else {})
    return boto3.session.Session().client("s3", endpoint_url=url, region_name=region(), config=config)


# ------------------------------------------------------------------------------ listing and reading

def listdir(path: str) -> list[str]:
    """The names directly under ``path`` (files and directories); FileNotFoundError when there
    is nothing there. On S3 a "directory" is a common prefix of keys."""
    if not is_s3(path):
        return os.listdir(path)
    from pyarrow import fs as pafs

    infos = s3_filesystem().get_file_info(pafs.FileSelector(_fs_path(path), allow_not_found=True))
    if not infos:
        # An empty listing: a missing prefix (pyarrow cannot tell an empty bucket from a missing
        # prefix, and neither can S3 for a prefix).
        raise FileNotFoundError(path)
    return [posixpath.basename(info.path.rstrip("/")) for info in infos]


def subdirectories(path: str) -> list[tuple[str, str]]:
    """``(name, full path)`` of the directories directly under ``path``, by name; empty when the
    warehouse does not exist (yet)."""
    if not is_s3(path):
        try:
            return sorted((e.name, e.path) for e in os.scandir(path) if e.is_dir())
        except FileNotFoundError:
            return []
    from pyarrow import fs as pafs

    infos = s3_filesystem().get_file_info(pafs.FileSelector(_fs_path(path), allow_not_found=True))
    names = sorted(posixpath.basename(i.path.rstrip("/")) for i in infos if i.type == pafs.FileType.Directory)
    return [(name, join(path, name)) for name in names]


def isdir(path: str) -> bool:
    """Whether ``path`` is a directory (locally) or a prefix with at least one object (S3)."""
    if not is_s3(path):
        return os.path.isdir(path)
    try:
        return bool(listdir(path))
    except FileNotFoundError:
        return False


def files_under(path: str) -> set[str]:
    """Every file below ``path`` outside folders (and files) whose name starts with ``_`` or
    ``.`` (a table's data files: what Delta's VACUUM may delete), as full locations."""
    if not is_s3(path):
        found: set[str] = set()
        for folder, dirs, files in os.walk(path):
            dirs[:] = [d for d in dirs if not d.startswith(("_", "."))]
            found.update(os.path.join(folder, f) for f in files if not f.startswith(("_", ".")))
        return found
    from pyarrow import fs as pafs

    root = _fs_path(path)
    infos = s3_filesystem().get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    out: set[str] = set()
    for info in infos:
        relative = info.path[len(root):].strip("/")
        if info.type == pafs.FileType.File and not any(p.startswith(("_", ".")) for p in relative.split("/")):
            out.add(join(path, relative))
    return out


def read_text(path: str) -> str:
    """The UTF-8 text of the file or object at ``path``; FileNotFoundError when absent."""
    if not is_s3(path):
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    with s3_filesystem().open_input_stream(_fs_path(path)) as stream:
        data: bytes = stream.read()
    return data.decode("utf-8")


def exists(path: str) -> bool:
    """Whether a file or directory (locally), or an object or non-empty prefix (S3), is at ``path``."""
    if not is_s3(path):
        return os.path.exists(path)
    from pyarrow import fs as pafs

    if s3_filesystem().get_file_info(_fs_path(path)).type != pafs.FileType.NotFound:
        return True
    return isdir(path)


def list_files(path: str) -> dict[str, str] | None:
    """S3 only: ``relative key -> s3:// URI`` of every object under the prefix ``path`` (all
    depths, in key order), or of the one object ``path`` names (keyed by its base name); None
    when there is nothing there. Local sources are walked by ``versiq.ingest.sources``."""
    from pyarrow import fs as pafs

    fs, root = s3_filesystem(), _fs_path(path)
    one = fs.get_file_info(root)
    if one.type == pafs.FileType.File:
        return {posixpath.basename(root): normalize(path)}
    infos = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    files = {info.path[len(root):].lstrip("/"): "s3://" + info.path
             for info in infos if info.type == pafs.FileType.File}
    return dict(sorted(files.items())) if files or infos else None


@contextlib.contextmanager
def local_copy(path: str) -> Iterator[str]:
    """A local path holding the bytes of ``path``: the path itself, or for an S3 object a
    temporary copy (deleted afterwards). Parsers read local files only, so an S3 read error can
    never look like bad content: a failed download is an ``OSError`` with an errno (EIO), which
    fails the run instead of rejecting the file's records (``versiq.ingest.sources``)."""
    if not is_s3(path):
        yield path
        return
    fd, local = tempfile.mkstemp(prefix="versiq-s3-", suffix=posixpath.splitext(path)[1])
    try:
        try:
            with os.fdopen(fd, "wb") as out, s3_filesystem().open_input_stream(_fs_path(path)) as stream:
                shutil.copyfileobj(stream, out, 1 << 20)
        except OSError as exc:
            raise OSError(errno.EIO, f"cannot read {path}: {exc}") from None
        yield local
    finally:
        with contextlib.suppress(OSError):
            os.unlink(local)


def all_files(path: str) -> list[str]:
    """Every file below ``path``, whatever its name (a table's log, checksums and hidden files
    included), as full locations, sorted; empty when nothing is there."""
    if not is_s3(path):
        return sorted(os.path.join(folder, f) for folder, _dirs, files in os.walk(path) for f in files)
    from pyarrow import fs as pafs

    root = _fs_path(path)
    infos = s3_filesystem().get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    return sorted(join(path, i.path[len(root):].strip("/")) for i in infos if i.type == pafs.FileType.File)


def file_size(path: str) -> int:
    """The size in bytes of the file or object at ``path``; FileNotFoundError when absent."""
    if not is_s3(path):
        return os.path.getsize(path)
    from pyarrow import fs as pafs

    info = s3_filesystem().get_file_info(_fs_path(path))
    if info.type != pafs.FileType.File:
        raise FileNotFoundError(path)
    return int(info.size)


def read_bytes(path: str) -> bytes:
    """The bytes of the file or object at ``path``; FileNotFoundError when absent."""
    if not is_s3(path):
        with open(path, "rb") as handle:
            return handle.read()
    with s3_filesystem().open_input_stream(_fs_path(path)) as stream:
        data: bytes = stream.read()
    return data


def write_bytes(path: str, data: bytes, mode: int = 0o644) -> None:
    """Replace the file or object at ``path`` with ``data``: locally through a temporary file
    renamed over it (readers see the old bytes or the new ones, never a mix), on S3 one PUT."""
    if not is_s3(path):
        folder = os.path.dirname(path)
        fd, temporary = tempfile.mkstemp(prefix=".versiq-", dir=folder)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            os.chmod(temporary, mode)
            os.replace(temporary, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
        return
    with s3_filesystem().open_output_stream(_fs_path(path)) as stream:
        stream.write(data)


def remove(path: str) -> bool:
    """Delete the file or object at ``path``; whether there was one."""
    if not is_s3(path):
        try:
            os.unlink(path)
        except FileNotFoundError:
            return False
        return True
    from pyarrow import fs as pafs

    fs = s3_filesystem()
    if fs.get_file_info(_fs_path(path)).type == pafs.FileType.NotFound:
        return False
    fs.delete_file(_fs_path(path))
    return True


def ensure_dir(path: str) -> None:
    """Create a local directory (and its parents); nothing to do for S3, where prefixes exist as
    soon as an object is written under them."""
    if not is_s3(path):
        os.makedirs(path, exist_ok=True)



def delete_file(path: str) -> None:
    """Delete the file or object at ``path``; nothing to do when it is already gone."""
    if not is_s3(path):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
        return
    with contextlib.suppress(FileNotFoundError):
        s3_filesystem().delete_file(_fs_path(path))


def delete_tree(path: str) -> None:
    """Delete the directory ``path`` and everything under it (an S3 prefix: every object under
    it, with pyarrow's ``delete_dir``); nothing to do when it is already gone."""
    if not is_s3(path):
        shutil.rmtree(path, ignore_errors=False, onerror=_ignore_missing)
        return
    with contextlib.suppress(FileNotFoundError):
        s3_filesystem().delete_dir(_fs_path(path))


def delete_children(path: str, keep: set[str]) -> None:
    """Delete everything directly under the directory or prefix ``path`` (files, and folders
    with all they hold) except the entries named in ``keep``; nothing to do when it is gone."""
    if not is_s3(path):
        try:
            entries = list(os.scandir(path))
        except FileNotFoundError:
            return
        for entry in entries:
            if entry.name in keep:
                continue
            if entry.is_dir(follow_symlinks=False):
                delete_tree(entry.path)
            else:
                delete_file(entry.path)
        return
    from pyarrow import fs as pafs

    fs = s3_filesystem()
    for info in fs.get_file_info(pafs.FileSelector(_fs_path(path), allow_not_found=True)):
        if posixpath.basename(info.path.rstrip("/")) in keep:
            continue
        with contextlib.suppress(FileNotFoundError):
            if info.type == pafs.FileType.Directory:
                fs.delete_dir(info.path)
            else:
                fs.delete_file(info.path)


def remove_empty_dir(path: str) -> None:
    """Remove the local directory ``path`` if it is empty (else, or when gone, leave it); nothing
    to do on S3, where a prefix without objects does not exist."""
    if not is_s3(path):
        with contextlib.suppress(OSError):
            os.rmdir(path)


def _ignore_missing(function: Any, path: str, exc_info: Any) -> None:
    """``shutil.rmtree``'s error hook: an entry already gone (a concurrent or earlier deletion) is
    fine, any other error is raised."""
    if not isinstance(exc_info[1], FileNotFoundError):
        raise exc_info[1]

# ------------------------------------------------------------------------------ DuckDB

@functools.cache
def _fsspec_s3_class() -> Any:
    """The fsspec file system class DuckDB reads ``s3://`` through (built once, on first use:
    fsspec is imported only by processes that read S3)."""
    from fsspec.implementations.arrow import ArrowFile, ArrowFSWrapper

    class PositionalArrowFile(ArrowFile):  # type: ignore[misc]
        """A read-only S3 object whose position is per thread, read with ``read_at``.

        DuckDB shares one handle between its threads and calls ``seek()`` then ``read()``;
        with one position per handle another thread can move it in between, and DuckDB then
        decodes bytes from the wrong offset (seen as ZSTD or Thrift errors on files of many row
        groups). Positional reads make every ``seek``/``read`` pair of a thread its own."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._positions = threading.local()

        def tell(self) -> int:
            return int(getattr(self._positions, "at", 0))

        def seek(self, offset: int, whence: int = 0) -> int:
            base = {0: 0, 1: self.tell(), 2: self.stream.size()}[whence]
            self._positions.at = base + offset
            return int(self._positions.at)

        def read(self, length: int | None = -1) -> bytes:
            at = self.tell()
            if length is None or length < 0:
                length = self.stream.size() - at
            data: bytes = self.stream.read_at(length, at)
            self._positions.at = at + len(data)
            return data

        def readinto(self, buffer: Any) -> int:
            data = self.read(len(memoryview(buffer)))
            memoryview(buffer)[:len(data)] = data
            return len(data)

    class S3ForDuckDB(ArrowFSWrapper):  # type: ignore[misc]
        protocol = S3_SCHEMES
        root_marker = ""

        @classmethod
        def _strip_protocol(cls, path: Any) -> Any:
            if isinstance(path, str) and is_s3(path):
                return path.split("://", 1)[1]
            return path

        def _open(self, path: str, mode: str = "rb", block_size: Any = None, seekable: bool = True,
                  **kwargs: Any) -> Any:
            if mode != "rb":
                raise ValueError("versiq reads S3 through DuckDB only (mode 'rb')")
            return PositionalArrowFile(self, self.fs.open_input_file(path), path, mode, block_size, **kwargs)

    return S3ForDuckDB


def _fsspec_s3() -> Any:
    """pyarrow's S3 file system as an fsspec file system answering ``s3://`` and ``s3a://``."""
    return _fsspec_s3_class()(s3_filesystem())


#: This process's in-memory DuckDB databases, one per configuration (``duckdb_connect``).
_databases: dict[tuple[int, tuple[tuple[str, Any], ...]], duckdb.DuckDBPyConnection] = {}
_databases_lock = threading.Lock()


def duckdb_connect(path: str | None = None, config: Mapping[str, Any] | None = None, *,
                   private: bool = False) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection that never downloads extensions and, when ``path`` (a warehouse or
    table location) is on S3, reads ``s3://`` files through pyarrow's S3 file system.

    For local paths it is a new connection (``cursor``) to an in-memory database this process
    keeps per ``config``: opening a database costs about 15 ms (its buffer manager and thread
    pool), a connection to one microseconds, and a small ingest run asks for four. Connections
    share nothing a caller makes (registered tables and temporary objects are the connection's
    own) and may be used from one thread each, as DuckDB documents; ``close`` closes only the
    connection. Settings are the database's, hence one per configuration; the pid in the key
    keeps a forked child off its parent's database. ``private``: a database of the caller's own,
    for one that changes settings or creates catalog objects (``versiq.sql``). S3 readers get
    one too, with the S3 file system registered on it."""
    settings = {**DUCKDB_OFFLINE, **(config or {})}
    s3 = path is not None and is_s3(path)
    if private or s3:
        con = duckdb.connect(config=settings)
        if s3:
            con.register_filesystem(_fsspec_s3())
        return con
    key = (os.getpid(), tuple(sorted(settings.items())))
    with _databases_lock:
        database = _databases.get(key)
        if database is None:
            database = _databases[key] = duckdb.connect(config=settings)
        return database.cursor()
