"""The "one writer per store" lock of a store whose warehouse is on S3: a lease object.

A local store is locked with ``fcntl.flock`` on ``<store>/_versiq/lock`` (``versiq.ingest.store``),
which the OS releases when the process dies. An S3 warehouse has no file system to lock, so the
same key holds a *lease* instead, written only with S3's conditional puts (boto3: the one client
that sends them; docs/research/s3-warehouse.md, section 5):

- **acquire**: ``PUT If-None-Match: *`` creates the object (a JSON body naming the holder: owner
  id, host, pid, boot id, PID namespace, generation, ttl, since). A 412 means it is held: the
  holder is read back, and when its lease has expired, or its holder is provably gone
  (``_Seen.abandoned``), it is taken over with ``PUT If-Match: <the etag seen>`` (of several
  contenders exactly one wins). Otherwise the writer polls until its ``timeout_s`` and fails with
  the same ``LockTimeout`` message as the local lock.
- **expiry** is judged by the *server's* clock (the ``Date`` of the GET against the object's
  ``Last-Modified``), never by comparing the clocks of two machines.
- **renew**: a daemon thread rewrites the body (its ``generation`` bumped: the ETag is the body's
  MD5, an identical body would keep it) with ``If-Match: <my etag>`` every ``ttl_s/3``. A 412 means
  the lease was taken over; transient errors (the S3 server restarting) are retried, and a lease
  with no successful write for ``ttl_s`` (by this process's monotonic clock) counts as lost.
- **release**: ``DELETE If-Match: <my etag>``, so a lease that is no longer ours is left alone.

The lease is a courtesy: it makes a second writer wait, with a clear message, instead of racing.
It is not what keeps the store consistent, and cannot be: a holder paused (GC, a suspended VM, a
partition) past its ttl still believes it holds the lease when it wakes. The real fencing is the
commit protocol: versiq's conditional-put Delta LogStore lets only one writer create
``_delta_log/N.json``, and the run's Delta ``txn`` id makes a run idempotent, so two writers cannot
both commit on one snapshot; a stale holder's commit fails instead of corrupting the store. The
writer still calls ``Lease.check()`` before it commits, to stop early when it knows it lost.
"""

from __future__ import annotations

import contextlib
import dataclasses
import email.utils
import functools
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from versiq.ingest.errors import LeaseLost, LockTimeout
from versiq.layout import PRIVATE_DIR
from versiq.storage import CONNECT_TIMEOUT_S, REQUEST_TIMEOUT_S, basename, endpoint, region, s3_client, split_s3

log = logging.getLogger("versiq.ingest")

DEFAULT_TTL_S = 30.0
#: ``Last-Modified`` and ``Date`` have one-second granularity (both truncated): a lease is judged
#: expired only this much after its ttl, so a holder never loses it before its own deadline.
CLOCK_GRANULARITY_S = 1.0
#: Error codes of a request worth repeating (besides every 5xx and every connection error).
_TRANSIENT_CODES = frozenset({"RequestTimeout", "RequestTimeTooSkewed", "SlowDown", "Throttling",
                              "ThrottlingException", "ServiceUnavailable", "InternalError"})


@dataclass(frozen=True)
class LeaseBody:
    """The lease object's content: who holds it, and for how long after its last write."""

    owner: str
    host: str
    pid: int
    generation: int
    ttl_s: float
    since: str
    #: The holder's kernel boot (``/proc/sys/kernel/random/boot_id``) and PID namespace
    #: (``/proc/self/ns/pid``): its ``pid`` means a process only to a reader with both equal.
    #: Empty when unknown (not Linux, or a lease written before they were recorded).
    boot_id: str = ""
    pid_ns: str = ""

    def encode(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> LeaseBody | None:
        """The body, or None for one this module did not write (it still holds the lease)."""
        try:
            raw = json.loads(data)
            return cls(owner=str(raw["owner"]), host=str(raw["host"]), pid=int(raw["pid"]),
                       generation=int(raw["generation"]), ttl_s=float(raw["ttl_s"]), since=str(raw["since"]),
                       boot_id=str(raw.get("boot_id") or ""), pid_ns=str(raw.get("pid_ns") or ""))
        except (ValueError, TypeError, KeyError):
            return None

    def describe(self) -> str:
        """The holder as the local lock names it: ``pid=123 host=h since=2026-...Z``."""
        return f"pid={self.pid} host={self.host} since={self.since}"


@dataclass(frozen=True)
class _Seen:
    """The lease object as one GET saw it, with the server's time of that GET."""

    etag: str
    body: LeaseBody | None
    last_modified: datetime
    server_now: datetime

    def expired(self) -> bool:
        # An unreadable body is still somebody's lease: it gets the default ttl.
        ttl = self.body.ttl_s if self.body is not None else DEFAULT_TTL_S
        return self.server_now > self.last_modified + timedelta(seconds=ttl + CLOCK_GRANULARITY_S)

    def abandoned(self) -> bool:
        """Whether the holder is provably a process that no longer exists (a killed run): its
        lease can be taken over at once instead of after its ttl.

        Only a holder this process can see is judged so: same host name, same kernel boot, same
        PID namespace (``process_identity``). A host name is not enough: containers with host
        networking share it, and a pid of another PID namespace (or of a previous boot) names
        some other process here, or none, while the holder may be alive. Any other holder, or one
        whose identity is unknown, is waited for until its lease expires."""
        body = self.body
        boot_id, pid_ns = process_identity()
        if body is None or body.host != socket.gethostname() or body.pid == os.getpid():
            return False
        if not (boot_id and pid_ns and body.boot_id == boot_id and body.pid_ns == pid_ns):
            return False
        try:
            os.kill(body.pid, 0)
        except ProcessLookupError:
            return True
        except OSError:  # it exists (another user's process)
            return False
        return False

    def describe(self) -> str:
        return self.body.describe() if self.body is not None else "an unreadable lease object"


def _read_identity(path: str, *, link: bool) -> str:
    """The target of the link, or the text of the file, at ``path``; ``""`` when unreadable."""
    try:
        if link:
            return os.readlink(path).strip()
        with open(path, encoding="ascii") as handle:
            return handle.read().strip()
    except (OSError, ValueError):
        return ""


@functools.cache
def process_identity() -> tuple[str, str]:
    """``(boot id, PID namespace)`` of this process: what makes its pid meaningful to a reader
    (``/proc/sys/kernel/random/boot_id``; ``pid:[4026531836]`` from ``/proc/self/ns/pid``).
    Either is ``""`` where the system does not tell (not Linux): then no holder is judged gone by
    its pid. Both are fixed for a process's life."""
    return (_read_identity("/proc/sys/kernel/random/boot_id", link=False),
            _read_identity("/proc/self/ns/pid", link=True))


def _status(exc: ClientError) -> int | None:
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return int(status) if status is not None else None


def _is_conflict(exc: BaseException) -> bool:
    """A failed precondition (HTTP 412): SeaweedFS 4.48 and AWS both answer ``PreconditionFailed``."""
    return isinstance(exc, ClientError) and (
        exc.response.get("Error", {}).get("Code") == "PreconditionFailed" or _status(exc) == 412)


def _is_missing(exc: BaseException) -> bool:
    return isinstance(exc, ClientError) and (
        exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404") or _status(exc) == 404)


def _is_transient(exc: BaseException) -> bool:
    """An error that says nothing about the lease: no connection, a timeout, a 5xx, throttling."""
    if isinstance(exc, BotoCoreError):
        return True
    if isinstance(exc, ClientError):
        status = _status(exc) or 0
        return status >= 500 or status in (408, 429) or exc.response.get("Error", {}).get("Code") in _TRANSIENT_CODES
    return False


def _lease_client(ttl_s: float) -> Any:
    """``s3_client()``'s client with timeouts under the ttl and no retries of its own: a renewal
    that hangs on a dead server must not outlive the lease it renews (the renew loop retries)."""
    import boto3
    from botocore.config import Config

    timeout = max(1.0, ttl_s / 4)
    config = s3_client().meta.config.merge(Config(
        connect_timeout=min(CONNECT_TIMEOUT_S, timeout), read_timeout=min(REQUEST_TIMEOUT_S, timeout),
        retries={"total_max_attempts": 1, "mode": "standard"}))
    return boto3.session.Session().client("s3", endpoint_url=endpoint(), region_name=region(), config=config)


def _utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _store_name(lock_uri: str) -> str:
    """The store's name in messages: ``store`` of ``s3://bucket/prefix/store/_versiq/lock``."""
    folder = lock_uri.rstrip("/").rsplit("/", 1)[0]
    if folder.endswith("/" + PRIVATE_DIR):
        folder = folder.rsplit("/", 1)[0]
    return basename(folder)


class Lease:
    """A held lease of one store, renewed in the background until the ``s3_lease`` block ends.

    ``check()`` before a commit; ``lost`` says the same without raising; ``holder`` names this
    writer as another one waiting for the lease sees it.
    """

    uri: str

    def __init__(self, uri: str, ttl_s: float, client: Any) -> None:
        if ttl_s <= 0:
            raise ValueError(f"a lease's ttl must be positive, not {ttl_s!r}")
        self.uri = uri
        self.ttl_s = ttl_s
        self.store = _store_name(uri)
        self._client = client
        self._bucket, self._key = split_s3(uri)
        self._owner = str(uuid.uuid4())
        self._mutex = threading.Lock()
        boot_id, pid_ns = process_identity()
        self._body = LeaseBody(owner=self._owner, host=socket.gethostname(), pid=os.getpid(), generation=1,
                               ttl_s=ttl_s, since=_utc_now(), boot_id=boot_id, pid_ns=pid_ns)
        self._etag: str | None = None
        self._last_ok = 0.0  # monotonic start of the last write known to have landed
        self._unconfirmed_since: float | None = None  # start of the oldest write of unknown outcome
        self._lost_reason: str | None = None
        self._last_error: str | None = None  # of the renewals since the last successful write
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._on_lost: list[Callable[[str], None]] = []
        self._told = False  # whether the callbacks were called

    # -- what the writer asks ------------------------------------------------------------------

    @property
    def owner(self) -> str:
        """This writer's id in the lease object (a fresh uuid4 per lease)."""
        return self._owner

    @property
    def holder(self) -> str:
        """This writer as the lease object names it (``pid=... host=... since=...``)."""
        return self._body.describe()

    @property
    def generation(self) -> int:
        """The lease object's generation as last written by this writer (grows with every write)."""
        with self._mutex:
            return self._body.generation

    @property
    def lost(self) -> bool:
        """Whether the lease was taken over, deleted, not renewed within its ttl, or released
        (final: a lease lost once is never held again)."""
        return self._loss() is not None

    def on_lost(self, callback: Callable[[str], None]) -> None:
        """Have ``callback(reason)`` called once, from the renewing thread, as soon as it finds
        the lease lost (taken over, deleted, or no renewal within the ttl): the writer's way to
        stop work that would not reach a ``check()`` soon (a Spark job writing to a dead server).
        Not called for a lease released by its holder. A callback must not raise or block long."""
        self._on_lost.append(callback)

    def _tell_lost(self, reason: str) -> None:
        with self._mutex:
            if self._told:
                return
            self._told = True
        for callback in self._on_lost:
            try:
                callback(reason)
            except Exception:  # noqa: BLE001 - the renewing thread must end quietly
                log.warning("a callback of the lost lease of store %r failed", self.store, exc_info=True)

    def check(self) -> None:
        """Raise ``LeaseLost`` unless this writer still holds the lease (call it before a commit)."""
        reason = self._loss()
        if reason is not None:
            raise LeaseLost(f"the lease of store {self.store!r} ({self.uri}) was lost: {reason}; "
                            "this writer must not commit")

    def _loss(self) -> str | None:
        with self._mutex:
            if self._lost_reason is None and self._etag is not None \
                    and time.monotonic() > self._last_ok + self.ttl_s:
                last = f" (last error: {self._last_error})" if self._last_error else ""
                self._lost_reason = f"no renewal succeeded for {self.ttl_s:g}s{last}"
            return self._lost_reason

    def _mark_lost(self, reason: str) -> None:
        with self._mutex:
            if self._lost_reason is None:
                self._lost_reason = reason
        log.error("lost the lease of store %r: %s", self.store, reason)
        self._tell_lost(reason)

    # -- S3 requests -----------------------------------------------------------------------------

    def _read(self) -> _Seen | None:
        """The lease object now, or None when there is none."""
        try:
            response = self._client.get_object(Bucket=self._bucket, Key=self._key)
        except ClientError as exc:
            if _is_missing(exc):
                return None
            raise
        with contextlib.closing(response["Body"]) as stream:
            data = stream.read()
        date = response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
        try:
            server_now = email.utils.parsedate_to_datetime(date) if date else None
        except (TypeError, ValueError):
            server_now = None
        if server_now is None:  # no Date header (never seen): fall back to this machine's clock
            log.warning("no Date header on the lease object of store %r: judging expiry by the local clock",
                        self.store)
            server_now = datetime.now(UTC)
        elif server_now.tzinfo is None:  # "-0000": UTC, as HTTP dates are
            server_now = server_now.replace(tzinfo=UTC)
        return _Seen(etag=response["ETag"], body=LeaseBody.decode(data), last_modified=response["LastModified"],
                     server_now=server_now)

    def _write(self, body: LeaseBody, if_match: str | None) -> tuple[bool, _Seen | None]:
        """PUT ``body`` if the object's ETag is ``if_match`` (if there is none, for None).

        ``(True, None)``: this writer holds the lease with ``body``. ``(False, seen)``: the
        precondition failed and ``seen`` is the object now (None: there is none). A 412 whose object
        is this writer's own is a write of ours that landed though its answer was lost (a timeout,
        or botocore retrying it): the lease is ours, with that object's ETag.
        Transient errors are raised, and the write's outcome stays unknown until the next one.
        """
        started = time.monotonic()
        condition = {"IfMatch": if_match} if if_match is not None else {"IfNoneMatch": "*"}
        try:
            response = self._client.put_object(Bucket=self._bucket, Key=self._key, Body=body.encode(),
                                               ContentType="application/json", **condition)
        except ClientError as exc:
            if not _is_conflict(exc):
                self._unconfirmed(started)
                raise
        else:
            self._held(body, response["ETag"], started)
            return True, None
        seen = self._read()
        if seen is not None and seen.body is not None and seen.body.owner == self._owner:
            with self._mutex:
                landed = self._unconfirmed_since if self._unconfirmed_since is not None else started
            self._held(seen.body, seen.etag, landed)
            return True, None
        return False, seen

    def _unconfirmed(self, started: float) -> None:
        with self._mutex:
            if self._unconfirmed_since is None:
                self._unconfirmed_since = started

    def _held(self, body: LeaseBody, etag: str, since: float) -> None:
        with self._mutex:
            self._body, self._etag = body, etag
            self._last_ok = max(self._last_ok, since)
            self._unconfirmed_since = None
            self._last_error = None

    # -- acquire, renew, release -------------------------------------------------------------------

    def acquire(self, timeout_s: float, poll_s: float) -> None:
        """Hold the lease (create it, or take over an expired one) or raise ``LockTimeout`` after
        ``timeout_s``. Errors other than transient ones are raised at once; transient ones are
        retried until the deadline, and the last one is raised if nobody was ever seen holding it."""
        deadline = time.monotonic() + timeout_s
        holder: _Seen | None = None
        error: Exception | None = None
        while True:
            at_once = False
            body = dataclasses.replace(self._body, since=_utc_now())  # "since" is when it was taken
            try:
                held, seen = self._write(body, None)
                if held:
                    break
                if seen is not None:
                    holder = seen
                    if seen.expired() or seen.abandoned():
                        generation = (seen.body.generation if seen.body is not None else 0) + 1
                        taken, now = self._write(dataclasses.replace(body, generation=generation), seen.etag)
                        if taken:
                            log.warning("took over the %s lease of store %r from %s", "expired" if seen.expired()
                                        else "abandoned (its process is gone)", self.store, seen.describe())
                            break
                        holder = now or holder  # another contender won the race: wait for its lease
                    else:
                        log.debug("store %r is leased by %s; waiting", self.store, seen.describe())
                else:
                    at_once = True  # released between the PUT and the GET: try again at once
            except Exception as exc:
                if not _is_transient(exc):
                    raise
                log.warning("acquiring the lease of store %r failed, retrying: %s", self.store, exc)
                error = exc
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if holder is None and error is not None:
                    raise error
                who = holder.describe() if holder is not None else "unknown"
                raise LockTimeout(f"store {self.store!r} is locked by another writer ({who}); "
                                  f"waited {timeout_s:g}s")
            if not at_once:
                time.sleep(min(poll_s, remaining))
        self._thread = threading.Thread(target=self._renew_loop, name=f"versiq-lease-{self.store}", daemon=True)
        self._thread.start()

    def _renew_loop(self) -> None:
        """Renew every ``ttl_s/3`` until stopped; retry transient errors sooner (logging the first
        of a run of failures only); stop when lost."""
        interval = self.ttl_s / 3
        retry = min(interval, max(0.1, self.ttl_s / 10))
        wait = interval
        failures = 0
        while not self._stop.wait(wait):
            reason = self._loss()
            if reason is not None:
                log.error("lost the lease of store %r: %s", self.store, reason)
                self._tell_lost(reason)
                return
            with self._mutex:
                body = dataclasses.replace(self._body, generation=self._body.generation + 1)
                etag = self._etag
            try:
                held, seen = self._write(body, etag)
            except Exception as exc:
                with self._mutex:
                    self._last_error = str(exc)
                failures += 1
                log.log(logging.WARNING if failures == 1 else logging.DEBUG,
                        "renewing the lease of store %r failed, retrying: %s", self.store, exc)
                wait = retry
                continue
            if not held:
                self._mark_lost(f"it is now held by {seen.describe()}" if seen is not None
                                else "its object was deleted")
                return
            if failures:
                log.info("renewed the lease of store %r again after %d failed attempts", self.store, failures)
            failures = 0
            wait = interval

    def release(self) -> None:
        """Stop renewing and delete the lease object if it is still ours. Never raises: a lease
        left behind expires after its ttl."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            with self._mutex:
                etag = self._etag
                if self._lost_reason is None:
                    self._lost_reason = "it was released"
            if etag is None:
                return
            try:
                self._client.delete_object(Bucket=self._bucket, Key=self._key, IfMatch=etag)
                return
            except ClientError as exc:
                if not _is_conflict(exc):
                    raise
            seen = self._read()  # a renewal of ours may have landed unseen: then it is still ours
            if seen is not None and seen.body is not None and seen.body.owner == self._owner:
                self._client.delete_object(Bucket=self._bucket, Key=self._key, IfMatch=seen.etag)
            elif seen is not None:
                log.warning("the lease of store %r is no longer ours (held by %s): left alone", self.store,
                            seen.describe())
        except Exception as exc:
            log.warning("releasing the lease of store %r failed (it expires after %gs): %s", self.store,
                        self.ttl_s, exc)


@contextlib.contextmanager
def s3_lease(lock_uri: str, timeout_s: float, *, ttl_s: float = DEFAULT_TTL_S,
             poll_s: float = 0.5) -> Iterator[Lease]:
    """Hold the lease object ``lock_uri`` (``s3://bucket/prefix/store/_versiq/lock``) for the block,
    waiting up to ``timeout_s`` for another writer (``LockTimeout``). The block calls
    ``Lease.check()`` before it commits; the lease is released when the block ends, however."""
    lease = Lease(lock_uri, ttl_s, _lease_client(ttl_s))
    lease.acquire(timeout_s, poll_s)
    try:
        yield lease
    finally:
        lease.release()
