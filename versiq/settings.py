"""Every ``VERSIQ_*`` environment variable, declared once: its name, how its value is parsed, its
default, what it means and which part of versiq reads it (as Kafka's ``StreamsConfig`` declares
its settings). Product code reads these variables only through this registry
(``LEASE_TTL.value()``), never with ``os.environ`` (tests/test_settings.py holds the rule), so a
variable's parsing, default and error message live in one place, docs/configuration.md's table
is rendered from it (``python -m versiq.settings --markdown``) and a misspelt variable is
reported (``warn_unknown``).

A value is read from the environment each time it is asked for, never cached: tests and the
resident driver change the environment of a running process. An unset or empty variable has
its default. A value that does not parse raises ``SettingError`` (a ``ValueError``) naming the
variable and quoting the value.

This module sits at the bottom of the import graph: it imports only the standard library and
``versiq.durations``.
"""

from __future__ import annotations

import difflib
import logging
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from versiq.durations import parse_duration_ms

T = TypeVar("T")

#: Every variable of versiq's starts with this.
PREFIX = "VERSIQ_"
#: Where a user reads what each variable does.
DOCS_PAGE = "docs/configuration.md"
#: ``reader`` values of variables the product never reads (the test suite's, the benchmarks',
#: Docker Compose's): known, so not reported as misspelt, and documented in a table of their own.
TOOLING_READERS = frozenset({"tests", "bench", "compose"})

log = logging.getLogger("versiq.settings")


class SettingError(ValueError):
    """A variable's value is unusable; the message names the variable and quotes the value."""


#: name -> declaration of every ``VERSIQ_*`` variable and family.
REGISTRY: dict[str, Setting[Any] | Family] = {}
#: Every declaration, ``Other`` ones included, in the order of the documentation's tables.
_ROWS: list[Row] = []


def _register(entry: Setting[Any] | Family) -> None:
    if entry.name in REGISTRY:
        raise ValueError(f"{entry.name} is declared twice")
    if not entry.name.startswith(PREFIX):
        raise ValueError(f"{entry.name} does not start with {PREFIX}")
    REGISTRY[entry.name] = entry
    _ROWS.append(entry)


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One variable: ``parse`` turns its (non-empty) text into the value or raises ``ValueError``
    with the reason; ``default`` is the value when it is unset or empty (None: the reader decides,
    e.g. from the warehouse or the master); ``meaning`` is the documentation's text; ``reader`` is
    the part of versiq that reads it (the documentation's "Used by")."""

    name: str
    parse: Callable[[str], T]
    default: T
    meaning: str
    reader: str

    def __post_init__(self) -> None:
        _register(self)

    def text(self, env: Mapping[str, str] | None = None) -> str | None:
        """The variable's raw text in ``env`` (default: this process's environment, now); None
        when it is unset or empty."""
        return (os.environ if env is None else env).get(self.name) or None

    def value(self, env: Mapping[str, str] | None = None) -> T:
        """The parsed value in ``env`` (default: this process's environment, read now), else the
        default; raises ``SettingError`` for a value that does not parse."""
        text = self.text(env)
        if text is None:
            return self.default
        try:
            return self.parse(text)
        except ValueError as exc:
            reason = str(exc)
            # the value is quoted once: by the reason when it names it, else here
            raise SettingError(f"{self.name}: {reason}" if repr(text) in reason
                               else f"{self.name}={text!r}: {reason}") from None

    @property
    def label(self) -> str:
        return f"`{self.name}`"


@dataclass(frozen=True)
class Family:
    """Variables named ``name`` + a suffix of the user's choosing (``VERSIQ_KAFKA_<NAME>``),
    each passed on verbatim."""

    name: str
    meaning: str
    reader: str

    def __post_init__(self) -> None:
        _register(self)

    def values(self, env: Mapping[str, str] | None = None) -> dict[str, str]:
        """suffix -> text of every variable of the family in ``env`` (default: this process's)."""
        env = os.environ if env is None else env
        return {name[len(self.name):]: text for name, text in env.items()
                if name.startswith(self.name) and len(name) > len(self.name)}

    @property
    def label(self) -> str:
        return f"`{self.name}<NAME>`"


@dataclass(frozen=True)
class Other:
    """A variable of another tool that versiq honours (``AWS_*``, ``SPARK_MASTER``): documented in
    the same table, read where it is used."""

    label: str
    meaning: str
    reader: str

    def __post_init__(self) -> None:
        _ROWS.append(self)


#: A row of the documentation's tables.
Row = Setting[Any] | Family | Other


# --- parse functions: each raises ValueError with the reason -------------------------------------


def string(value: str) -> str:
    return value


def whole_number(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{value!r} is not a whole number") from None


def number(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{value!r} is not a number") from None


def duration_s(value: str) -> float:
    """A duration (``parse_duration_ms``: ``1500``, ``250ms``, ``30s``, ``PT1H``) in seconds."""
    return parse_duration_ms(value) / 1000


def positive_duration_s(value: str) -> float:
    seconds = duration_s(value)
    if seconds <= 0:
        raise ValueError(f"must be positive, got {value!r}")
    return seconds


def lease_ttl_s(value: str) -> float:
    """A lease's ttl: at least 3 s, so that a renewal (every third of it) has time to land."""
    seconds = duration_s(value)
    if seconds < 3:
        raise ValueError(f"must be at least 3s (got {value!r})")
    return seconds


def comma_list(value: str) -> tuple[str, ...]:
    """Comma-separated items, blanks around them and empty ones left out."""
    return tuple(item.strip() for item in value.split(",") if item.strip())


def autostart_idle(value: str) -> str | None:
    """``VERSIQ_DRIVER_AUTOSTART``: the duration as written (handed to ``versiq driver
    --idle-timeout``), or None for ``off`` or a zero duration (never start a driver)."""
    idle = value.strip()
    if not idle or idle.lower() == "off" or parse_duration_ms(idle) == 0:
        return None
    return idle


# --- the variables, in the order of docs/configuration.md -----------------------------------------

WAREHOUSE: Setting[str | None] = Setting(
    "VERSIQ_WAREHOUSE", string, None,
    "the warehouse (`--warehouse`): a directory or `s3://bucket/prefix`", "all")
AWS = (
    Other("`AWS_ENDPOINT_URL` (`AWS_ENDPOINT_URL_S3`)",
          "an S3-compatible server's URL (path-style requests; `http://` has TLS off); unset for AWS", "all, S3"),
    Other("`AWS_REGION` (`AWS_DEFAULT_REGION`)", "the bucket's region, default `us-east-1`", "all, S3"),
    Other("`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`",
          "credentials (or profiles, instance roles: the AWS default chain); never logged", "all, S3"),
)
LEASE_TTL: Setting[float | None] = Setting(
    "VERSIQ_LEASE_TTL", lease_ttl_s, None,
    "ttl of a writer's lease on an S3 store, default `30s` (a crashed writer on another host blocks the store "
    "that long; one on the same host is taken over at once)", "ingest, maintain, S3")
HOST: Setting[str] = Setting(
    "VERSIQ_HOST", string, "127.0.0.1", "bind address, default `127.0.0.1` (`--host`)", "serve")
PORT: Setting[int] = Setting("VERSIQ_PORT", whole_number, 8080, "port, default `8080` (`--port`)", "serve")
WORKERS: Setting[int] = Setting(
    "VERSIQ_WORKERS", whole_number, 1,
    "worker processes, default 1 (`--workers`); all of them map the same serving index files", "serve")
CACHE_DIR: Setting[str | None] = Setting(
    "VERSIQ_CACHE_DIR", string, None,
    "local folder of the serving indexes (memory-mapped files of each store's current snapshot, "
    "`query/index_files.py`), default `$XDG_CACHE_HOME/versiq` or `~/.cache/versiq`; every worker, replica and "
    "CLI read on the host shares it (a `versiq get` after a `serve` opens the files instead of building them); "
    "never inside an S3 warehouse. Give it local disk space about the size of the stores' current data",
    "serve, get, keys, lookup")
LOG_FORMAT: Setting[str] = Setting(
    "VERSIQ_LOG_FORMAT", string, "text", "`text` (default) or `json` (`--log-format`)", "all")
LOG_LEVEL: Setting[str] = Setting(
    "VERSIQ_LOG_LEVEL", string, "INFO", "`DEBUG`, `INFO` (default), `WARNING`, `ERROR` (`--log-level`)", "all")
REFRESH_INTERVAL: Setting[float] = Setting(
    "VERSIQ_REFRESH_INTERVAL", duration_s, 1.0,
    "how often the service lists the warehouse for new, removed or failing stores, default `1s`", "serve")
WATCH_INTERVAL: Setting[float | None] = Setting(
    "VERSIQ_WATCH_INTERVAL", duration_s, None,
    "how often it checks whether the next commit of each store it serves has landed (one `stat`, or a HEAD on "
    "S3), default `100ms` (`500ms` on S3). On a local warehouse the kernel's file notifications (inotify) also "
    "start that check as soon as a commit file is written, so a commit is served about the build of its changed "
    "buckets after it lands; the interval still catches what the kernel does not see (a network file system "
    "written from another host)", "serve")
API_TOKENS: Setting[str | None] = Setting(
    "VERSIQ_API_TOKENS", string, None,
    "comma-separated bearer tokens; when set (or the file below), every `/v1` request needs "
    "`Authorization: Bearer <token>`. Off by default", "serve")
API_TOKENS_FILE: Setting[str | None] = Setting(
    "VERSIQ_API_TOKENS_FILE", string, None, "a file with one bearer token per line (`#` comments)", "serve")
CORS_ORIGINS: Setting[tuple[str, ...]] = Setting(
    "VERSIQ_CORS_ORIGINS", comma_list, (),
    "comma-separated allowed origins (`*` for any); CORS is off when unset", "serve")
TOKEN_SECRET: Setting[str | None] = Setting(
    "VERSIQ_TOKEN_SECRET", string, None,
    "secret that signs page tokens; set the same value on every replica behind one address (unset: random per "
    "start, shared by that start's workers)", "serve")
PAGE_TOKEN_TTL: Setting[float] = Setting(
    "VERSIQ_PAGE_TOKEN_TTL", duration_s, 3600.0, "page-token lifetime, default `1h`", "serve")
REQUEST_HEAD_TIMEOUT: Setting[float] = Setting(
    "VERSIQ_REQUEST_HEAD_TIMEOUT", positive_duration_s, 10.0,
    "time allowed for a request's line and headers to arrive, default `10s`; slower or idle connections are "
    "closed", "serve")
REQUEST_BODY_TIMEOUT: Setting[float] = Setting(
    "VERSIQ_REQUEST_BODY_TIMEOUT", positive_duration_s, 60.0,
    "time allowed for a request's body to arrive after its head, default `60s`; a slower upload gets "
    "`408 Request Timeout`", "serve")
SPARK_MASTER = Other("`SPARK_MASTER`", "Spark master URL (`--master`), default `local[*]`", "ingest")
DRIVER_AUTOSTART: Setting[str | None] = Setting(
    "VERSIQ_DRIVER_AUTOSTART", autostart_idle, None,
    "a duration (`30m`): a batch run that starts Spark on a local master and finds no resident driver starts one, "
    "which ends after that long without a run; unset (default), `off` or `0`: never", "ingest")
DRIVER_SOCKET: Setting[str | None] = Setting(
    "VERSIQ_DRIVER_SOCKET", string, None,
    "the resident driver's Unix socket (`versiq driver`), default `$XDG_RUNTIME_DIR/versiq/driver.sock` or "
    "`~/.cache/versiq/driver.sock`; `off`: batch runs never use a driver", "ingest, driver")
JVM_ARCHIVE_DIR: Setting[str | None] = Setting(
    "VERSIQ_JVM_ARCHIVE_DIR", string, None,
    "folder of the driver JVM's class-data-sharing archive (written by `make`, best effort, or "
    "`write_class_archive` in `versiq/ingest/class_archive.py`), default `.cache/jvm` of the checkout", "ingest")
DRIVER_JAVA_OPTIONS: Setting[str | None] = Setting(
    "VERSIQ_DRIVER_JAVA_OPTIONS", string, None,
    "extra options of the driver JVM (`spark.driver.extraJavaOptions`)", "ingest")
DRIVER_MEMORY: Setting[str] = Setting(
    "VERSIQ_DRIVER_MEMORY", string, "4g", "the driver's memory (`spark.driver.memory`), default `4g`", "ingest")
INTERPRETED_RUN_BYTES: Setting[int] = Setting(
    "VERSIQ_INTERPRETED_RUN_BYTES", whole_number, 4 << 20,
    "a run (one-shot or a `--continuous` micro-batch) over at most this many bytes of new local files (a Kafka "
    "run's records count 256 bytes each) plans for little data: Spark's expressions evaluated without compiling "
    "generated code, no adaptive query execution, one shuffle partition per core; default `4194304`; `0` never",
    "ingest")
PARSE_HERE_BYTES: Setting[int | None] = Setting(
    "VERSIQ_PARSE_HERE_BYTES", whole_number, None,
    "a run over at most this many bytes of new local JSONL and CSV files (no Parquet; at most 2M records) parses "
    "them in its own process, not in Spark's Python workers, and decides them there (DuckDB); a store's Kafka run "
    "(its records count 256 bytes each) is read there too, with the confluent-kafka client; default "
    "`134217728` (128 MiB) with a local master, a small run's 4 MiB with a cluster's; `0` never", "ingest")
DERIVE_HERE_RECORDS: Setting[int | None] = Setting(
    "VERSIQ_DERIVE_HERE_RECORDS", whole_number, None,
    "a derived pass over at most this many new source records runs in the process that runs the pipeline, "
    "partition after partition; a larger one runs as Spark tasks, one per partition "
    "([derived-tables.md](derived-tables.md)); default `100000`, `0` always in Spark tasks", "ingest")
PARALLEL_RUNS: Setting[int] = Setting(
    "VERSIQ_PARALLEL_RUNS", whole_number, 3,
    "how many stores and streams of a pipeline run ingest at the same time, and how many of its derived "
    "topologies that share no table run at once, each on a Spark session of its own; a run over more than "
    "`VERSIQ_INTERPRETED_RUN_BYTES` (a derived pass in Spark tasks) waits for the other large ones; default `3`, "
    "`1` one after the other", "ingest")
BUCKET_SCANS_LIMIT: Setting[int | None] = Setting(
    "VERSIQ_BUCKET_SCANS_LIMIT", whole_number, None,
    "a run whose keys fall in at most this many buckets reads their stored versions bucket by bucket, each "
    "bucket's files for that bucket's keys only (DuckDB then skips the row groups that hold none of them); a run "
    "touching more reads them in one scan; default `64`, `0` always one scan", "ingest")
SHUFFLE_PARTITIONS: Setting[str] = Setting(
    "VERSIQ_SHUFFLE_PARTITIONS", string, "8", "`spark.sql.shuffle.partitions`, default `8`", "ingest")
SPARK_JARS: Setting[str | None] = Setting(
    "VERSIQ_SPARK_JARS", string, None,
    "folder of Delta's (and the S3) jars, default `.cache/jars` of the checkout ([packaging.md](packaging.md))",
    "ingest")
KAFKA: Family = Family(
    "VERSIQ_KAFKA_",
    "a Kafka client setting (`VERSIQ_KAFKA_SASL_JAAS_CONFIG` is `sasl.jaas.config`; wins over the pipeline "
    "file's `options`); never logged", "ingest")
VACUUM_RETENTION_HOURS: Setting[float] = Setting(
    "VERSIQ_VACUUM_RETENTION_HOURS", number, 1.0,
    "how long vacuum keeps files no longer needed, default `1` (hour)", "maintain")

# --- variables of the tools around versiq (never read by the product) -----------------------------

DATA: Setting[str | None] = Setting(
    "VERSIQ_DATA", string, None,
    "the folder of changelog files [`compose.yaml`](../compose.yaml)'s ingest services read, default "
    "`./demo-data`", "compose")
S3_ACCESS_KEY: Setting[str | None] = Setting(
    "VERSIQ_S3_ACCESS_KEY", string, None,
    "the access key of the S3 server of `docker compose --profile s3`, default `versiq`", "compose")
S3_SECRET_KEY: Setting[str | None] = Setting(
    "VERSIQ_S3_SECRET_KEY", string, None,
    "its secret key, default `versiq-change-me`", "compose")
CHROMIUM: Setting[str] = Setting(
    "VERSIQ_CHROMIUM", string, "/usr/bin/chromium",
    "the Chromium the console's browser tests drive, default `/usr/bin/chromium` "
    "(`scripts/ensure-chromium.sh`)", "tests")
CONFORMANCE_SCENARIOS: Setting[int | None] = Setting(
    "VERSIQ_CONFORMANCE_SCENARIOS", whole_number, None,
    "random scenarios of the conformance tests against Kafka Streams: 200 for stores and 32 per operator in "
    "`make test`, 10,000 in `make conformance` ([conformance.md](conformance.md))", "tests")
CONFORMANCE_GROUP: Setting[int | None] = Setting(
    "VERSIQ_CONFORMANCE_GROUP", whole_number, None,
    "scenarios per versiq pipeline of the operators' conformance test, default 32, one pipeline per operator "
    "(`make conformance`: 500)",
    "tests")
CONFORMANCE_GROUPS: Setting[int | None] = Setting(
    "VERSIQ_CONFORMANCE_GROUPS", whole_number, None,
    "pipelines per Spark run (one batch) of the operators' conformance test, default 14", "tests")
CONFORMANCE_SEED: Setting[int | None] = Setting(
    "VERSIQ_CONFORMANCE_SEED", whole_number, None,
    "the seed of both conformance tests: `make test` runs seed 0, `make conformance` a fresh one it prints "
    "first; a seed repeats its scenarios exactly", "tests")
CONFORMANCE_BATCHES: Setting[tuple[str, ...]] = Setting(
    "VERSIQ_CONFORMANCE_BATCHES", comma_list, (),
    "comma-separated batches of that seed to run again (default: all)", "tests")
CONFORMANCE_OPERATORS: Setting[tuple[str, ...]] = Setting(
    "VERSIQ_CONFORMANCE_OPERATORS", comma_list, (),
    "comma-separated operators of the operators' conformance test to run (default: all: `filter`, `join`, "
    "`fk_join`, `aggregate`, `aggregate_join`, `aggregate_twice`, `stream_join`); leaving one out changes the "
    "scenarios drawn for those after it", "tests")
CONFORMANCE_REPORT: Setting[str | None] = Setting(
    "VERSIQ_CONFORMANCE_REPORT", string, None,
    "a file the conformance tests append each difference they find to, once", "tests")
CONFORMANCE_TIMEOUT: Setting[int | None] = Setting(
    "VERSIQ_CONFORMANCE_TIMEOUT", whole_number, None,
    "seconds the operators' conformance test may take, default 600 plus 0.2 per scenario, times the load "
    "per core", "tests")
CONFORMANCE_CLASSES: Setting[str | None] = Setting(
    "VERSIQ_CONFORMANCE_CLASSES", string, None,
    "a folder of classes compiled from `conformance/kafka`'s sources (`javac -d`), put first on the Kafka "
    "Streams harness's classpath; the harness's jar is then not rebuilt", "tests")
BENCH_WORK: Setting[str] = Setting(
    "VERSIQ_BENCH_WORK", string, "/tmp/versiq-bench",
    "the benchmarks' working folder (`--work`), default `/tmp/versiq-bench` ([benchmarks.md](benchmarks.md))",
    "bench")

#: docs/configuration.md's table of the variables that configure versiq, in declaration order.
PRODUCT_ROWS: tuple[Row, ...] = tuple(row for row in _ROWS if row.reader not in TOOLING_READERS)
#: ... and its table of the tooling's variables.
TOOLING_ROWS: tuple[Row, ...] = tuple(row for row in _ROWS if row.reader in TOOLING_READERS)


# --- documentation ---------------------------------------------------------------------------------


def markdown_table(rows: tuple[Setting[Any] | Family | Other, ...]) -> str:
    """``rows`` as docs/configuration.md's Markdown table (variable, who reads it, meaning)."""
    lines = ["| Variable | Used by | Meaning |", "| --- | --- | --- |"]
    lines += [f"| {row.label} | {row.reader} | {row.meaning} |" for row in rows]
    return "\n".join(lines) + "\n"


# --- unknown variables -----------------------------------------------------------------------------


def unknown(env: Mapping[str, str] | None = None) -> list[str]:
    """One line per ``VERSIQ_*`` variable of ``env`` (default: this process's) that versiq does
    not know, naming the closest known one when one is close (a misspelling)."""
    env = os.environ if env is None else env
    # compared without the prefix every name shares, which would make any two look alike
    known = [name[len(PREFIX):] for name, entry in REGISTRY.items() if isinstance(entry, Setting)]
    families = tuple(name for name, entry in REGISTRY.items() if isinstance(entry, Family))
    lines = []
    for name in sorted(env):
        if not name.startswith(PREFIX) or name in REGISTRY or name.startswith(families):
            continue
        close = difflib.get_close_matches(name[len(PREFIX):], known, n=1)
        hint = f"did you mean {PREFIX}{close[0]}?" if close else f"see {DOCS_PAGE} for the variables versiq reads"
        lines.append(f"unknown environment variable {name}: {hint}")
    return lines


_warned = False


def warn_unknown(env: Mapping[str, str] | None = None) -> None:
    """Log ``unknown`` as warnings, once per process (the CLI and ``versiq serve`` call it as
    they start; a second call does nothing)."""
    global _warned
    if _warned:
        return
    _warned = True
    for line in unknown(env):
        log.warning("%s", line)


@contextmanager
def overridden(values: Mapping[Setting[Any], str]) -> Iterator[None]:
    """This process's environment with ``values`` set for the block, each variable as it was after."""
    saved = {setting.name: os.environ.get(setting.name) for setting in values}
    try:
        os.environ.update({setting.name: text for setting, text in values.items()})
        yield
    finally:
        for name, before in saved.items():
            if before is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = before


def main(argv: list[str]) -> int:
    """``python -m versiq.settings --markdown``: print docs/configuration.md's tables."""
    if argv != ["--markdown"]:
        print("usage: python -m versiq.settings --markdown", file=sys.stderr)
        return 2
    print(markdown_table(PRODUCT_ROWS))
    print(markdown_table(TOOLING_ROWS), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
