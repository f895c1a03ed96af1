"""``versiq driver`` (``ingest.driver``): batch ``versiq ingest`` runs in a warm session that a
real driver process holds, with the same result, output and exit status as a run in the CLI's
own process; requests it cannot run as asked, a socket left by a killed driver and a caller that
goes away during its run.

The module shares one driver (started without its warm-up runs, which ``test_warm_up...`` covers
in-process); the CLI processes that should not use it get ``VERSIQ_DRIVER_SOCKET=off`` (the
whole test session has it, tests/conftest.py)."""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.ingest.test_ingest_cli import env, make_changelog
from tests.support.ingest import rejected_rows, store_versions, write_jsonl
from versiq.ingest.driver import Driver, check_free, claim, serving_problem, staged
from versiq.ingest.driver_client import (
    _driver_present,
    _file_line,
    autostart_hook,
    code_identity,
    driver_pid,
    log_path,
    run_environment,
    socket_path,
    start_driver,
)
from versiq.ingest.warm_up import warm_up

VERSIQ = [sys.executable, "-m", "versiq.cli"]
PID = re.compile(r"running in the resident driver \(pid (\d+)\)")


#: The environment of every process this module starts, taken once: a PySpark session that
#: starts in this test process later (the ``spark`` fixture) adds variables of its own
#: (``SPARK_BUFFER_SIZE``, ...) to ``os.environ``, and a driver started before it would rightly
#: refuse clients started after it.
_BASE_ENV = env()


def _client_env(socket: str | None) -> dict[str, str]:
    return {**_BASE_ENV, "VERSIQ_DRIVER_SOCKET": socket or "off"}


def _driver_env() -> dict[str, str]:
    e = dict(_BASE_ENV)
    e.pop("VERSIQ_DRIVER_SOCKET", None)
    return e


class DriverProcess:
    """``versiq driver`` on a socket of the test, its standard error kept in a file."""

    def __init__(self, folder: str, *extra: str) -> None:
        self.socket = os.path.join(folder, "driver.sock")
        self.log_path = os.path.join(folder, "driver.log")
        self._log = open(self.log_path, "w", encoding="utf-8")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen([*VERSIQ, "driver", "--socket", self.socket, "--no-warm-up", *extra],
                                     env=_driver_env(), stdout=subprocess.PIPE, stderr=self._log,
                                     stdin=subprocess.DEVNULL, text=True, start_new_session=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # "versiq driver: ready on ..." once it serves
        assert "ready on" in line, f"the driver did not start: {line!r} {self.log()}"

    def log(self) -> str:
        with open(self.log_path, encoding="utf-8") as f:
            return f.read()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=60)
        self._log.close()
        return code


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    process = DriverProcess(str(tmp_path_factory.mktemp("driver")))
    yield process
    assert process.stop() == 0, process.log()
    assert not os.path.exists(process.socket), "the driver removes its socket when it ends"


def ingest(socket: str | None, *args: str, cwd: str | None = None, extra_env: dict[str, str] | None = None,
           umask: int | None = None) -> subprocess.CompletedProcess[str]:
    e = {**_client_env(socket), **(extra_env or {})}
    return subprocess.run([*VERSIQ, "ingest", "--log-level", "DEBUG", *args], capture_output=True, text=True,
                          timeout=300, env=e, cwd=cwd, stdin=subprocess.DEVNULL,
                          preexec_fn=None if umask is None else lambda: os.umask(umask))


def ran_in(result: subprocess.CompletedProcess[str]) -> int | None:
    """The driver's pid when the run was the driver's, else None."""
    found = PID.search(result.stderr)
    return int(found.group(1)) if found else None


def _rejected(store: str) -> list[dict]:
    """The store's rejected rows, less the wall-clock time of their run."""
    return [{k: v for k, v in row.items() if k != "ingested_at"} for row in rejected_rows(store)]


def _report(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        report = json.load(f)
    for entry in report["stores"].values():
        entry.pop("seconds")
    return report


def test_a_run_in_the_driver_is_the_run_the_cli_makes(driver, tmp_path):
    """Same store, same rejected rows, same report and summary as a run in the CLI's own process;
    relative paths are the caller's; a refused setting is exit 2 with the CLI's message."""
    src = tmp_path / "src"
    make_changelog(src, files=2, keys=120)
    via = ingest(driver.socket, "--warehouse", "wh-driver", "--store", "s", "--source", "src", "--max-future", "none",
                 "--report", "report.json", cwd=str(tmp_path))
    assert via.returncode == 0, via.stderr
    assert ran_in(via) == driver.proc.pid, via.stderr
    alone = ingest(None, "--warehouse", str(tmp_path / "wh-alone"), "--store", "s", "--source", str(src),
                   "--max-future", "none", "--report", str(tmp_path / "alone.json"))
    assert alone.returncode == 0, alone.stderr
    assert ran_in(alone) is None
    driver_store, alone_store = str(tmp_path / "wh-driver" / "s"), str(tmp_path / "wh-alone" / "s")
    assert store_versions(driver_store) == store_versions(alone_store)
    assert _rejected(driver_store) == _rejected(alone_store) != []
    assert _report(str(tmp_path / "report.json")) == _report(str(tmp_path / "alone.json"))
    summary = [line for line in via.stderr.splitlines() if line.startswith("store s: read")]
    assert len(summary) == 1 and summary[0].split(" in ")[0] == \
        next(line for line in alone.stderr.splitlines() if line.startswith("store s: read")).split(" in ")[0]

    refused = ingest(driver.socket, "--warehouse", "wh-driver", "--store", "s", "--source", "src",
                     "--history-retention", "5m", cwd=str(tmp_path))
    assert refused.returncode == 2, refused.stderr
    assert ran_in(refused) == driver.proc.pid
    assert "it cannot be changed to 5m" in refused.stderr
    again = ingest(driver.socket, "--warehouse", "wh-driver", "--store", "s", "--source", "src", cwd=str(tmp_path))
    assert again.returncode == 0 and "no new files" in again.stderr, again.stderr


def test_a_request_the_driver_cannot_run_as_asked_runs_in_the_callers_process(driver, tmp_path):
    """Another value of a variable that shapes a run, or another master: the CLI runs it itself
    (here a run with nothing new, which needs no JVM) and says why."""
    src = tmp_path / "src"
    write_jsonl(str(src), "a.jsonl", ['{"key":"a","value":1,"timestamp":5}'])
    first = ingest(driver.socket, "--warehouse", str(tmp_path / "wh"), "--store", "s", "--source", str(src))
    assert first.returncode == 0 and ran_in(first) == driver.proc.pid, first.stderr
    # what a PySpark session sets in its process (a CLI started from an orchestrator's task)
    # does not shape the run: the driver takes it
    inherited = {"SPARK_BUFFER_SIZE": "65536", "SPARK_AUTH_SOCKET_TIMEOUT": "15",
                 "PYSPARK_DRIVER_PYTHON": _BASE_ENV.get("PYSPARK_DRIVER_PYTHON", sys.executable)}
    from_pyspark = ingest(driver.socket, "--warehouse", str(tmp_path / "wh"), "--store", "s", "--source", str(src),
                          extra_env=inherited)
    assert from_pyspark.returncode == 0 and ran_in(from_pyspark) == driver.proc.pid, from_pyspark.stderr
    mask = os.umask(0o022)
    os.umask(mask)
    cases = [
        ({"VERSIQ_SHUFFLE_PARTITIONS": "3"}, [], None, "its environment differs in VERSIQ_SHUFFLE_PARTITIONS"),
        ({"AWS_SECRET_ACCESS_KEY": "not-sent-in-clear"}, [], None, "its environment differs in AWS_SECRET_ACCESS_KEY"),
        ({"TZ": "Europe/Oslo"}, [], None, "its environment differs in TZ"),
        ({}, ["--master", "local[1]"], None, "it runs on master local[*]"),
        ({}, [], mask ^ 0o007, f"its umask is {mask:03o}"),
    ]
    for extra_env, extra_args, umask, why in cases:
        result = ingest(driver.socket, "--warehouse", str(tmp_path / "wh"), "--store", "s", "--source", str(src),
                        *extra_args, extra_env=extra_env, umask=umask)
        assert result.returncode == 0, result.stderr
        assert ran_in(result) is None
        assert f"does not run this: {why}; running here" in result.stderr, result.stderr
        assert "no new files" in result.stderr


def test_the_driver_refuses_other_code_and_environments():
    driver = Driver(None, "local[*]", lambda argv: None)  # type: ignore[arg-type, return-value]
    request = {"code": code_identity(), "env": run_environment(os.environ), "umask": driver.umask}
    assert driver.refusal(request) is None
    assert "runs other code" in (driver.refusal({**request, "code": "versiq 0.0.9 elsewhere"}) or "")
    assert "differs in VERSIQ_NEW" in (driver.refusal({**request, "env": {**request["env"], "VERSIQ_NEW": "1"}}) or "")
    shown = run_environment({"VERSIQ_LOG_LEVEL": "DEBUG", "VERSIQ_DRIVER_SOCKET": "x", "HOME": "/h",
                             "AWS_SECRET_ACCESS_KEY": "s3cr3t", "LANG": "C"})
    assert sorted(shown) == ["AWS_SECRET_ACCESS_KEY", "HOME", "PYSPARK_DRIVER_PYTHON", "PYSPARK_PYTHON"]
    # set by a PySpark session in its own process, set again by every session: not compared
    assert run_environment({"SPARK_BUFFER_SIZE": "1", "SPARK_AUTH_SOCKET_TIMEOUT": "2"}) == run_environment({})
    # unset is the running interpreter, as ``get_spark`` sets it; another interpreter differs
    assert run_environment({"PYSPARK_PYTHON": sys.executable}) == run_environment({})
    assert run_environment({"PYSPARK_PYTHON": "/opt/other/python"}) != run_environment({})
    # a relative interpreter path is the caller's folder's
    relative = os.path.relpath(sys.executable)
    if os.sep in relative:
        assert run_environment({"PYSPARK_PYTHON": relative}) == run_environment({})
    assert "s3cr3t" not in json.dumps(shown)  # values travel as digests
    # a value that is not UTF-8 (os.environ holds its bytes as surrogates) is a value like another
    assert run_environment({"VERSIQ_X": "\udcff"}) != run_environment({"VERSIQ_X": "\udcfe"})
    assert "no environment" in (driver.refusal({**request, "env": None}) or "")
    assert "umask" in (driver.refusal({**request, "umask": 0o777}) or "")
    assert socket_path({"VERSIQ_DRIVER_SOCKET": "off"}) is None
    assert socket_path({"XDG_RUNTIME_DIR": "/run/user/7"}) == "/run/user/7/versiq/driver.sock"


def test_the_code_identity_covers_the_jars_spark_loads(tmp_path, monkeypatch):
    """A rebuilt LogStore jar (or any jar of the folder Spark loads) is other code: a driver
    started before it refuses the next request. A file of the package that cannot be read (an
    editor's lock link to nowhere) counts as absent instead of failing the client's run."""
    jars = tmp_path / "jars"
    jars.mkdir()
    (jars / "delta-spark_4.2_2.13-4.4.0.jar").write_bytes(b"delta")
    logstore = jars / "versiq-delta-logstore-1.jar"
    logstore.write_bytes(b"classes v1")
    monkeypatch.setenv("VERSIQ_SPARK_JARS", str(jars))
    before = code_identity()
    assert code_identity() == before
    logstore.write_bytes(b"classes v2, rebuilt")
    rebuilt = code_identity()
    assert rebuilt != before
    os.utime(logstore, ns=(1, 1))
    assert code_identity() != rebuilt
    (jars / "hadoop-aws-3.5.0.jar").write_bytes(b"s3a")
    assert len({before, rebuilt, code_identity()}) == 3
    nowhere = tmp_path / ".#edited.py"
    nowhere.symlink_to(tmp_path / "missing")
    assert _file_line("edited", str(nowhere)) == b"edited absent\n"


def test_a_driver_never_removes_what_is_not_a_dead_socket(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    with pytest.raises(OSError, match="is not a socket"):
        check_free(str(notes))
    assert notes.read_text() == "mine"
    with pytest.raises(OSError, match="longer than"):
        check_free(str(tmp_path / ("x" * 120)))


def test_a_request_while_the_driver_is_busy_runs_in_its_own_process(driver, tmp_path):
    """A request never waits for another's run (the CLI would not have): it runs in its own
    process while the driver's run goes on, and both end as they would have alone."""
    small = tmp_path / "small"
    write_jsonl(str(small), "a.jsonl", ['{"key":"a","value":1,"timestamp":5}'])
    first = ingest(driver.socket, "--warehouse", str(tmp_path / "wh"), "--store", "small", "--source", str(small))
    assert first.returncode == 0 and ran_in(first) == driver.proc.pid, first.stderr
    big = tmp_path / "big"
    make_changelog(big, files=4, keys=3000)
    busy = subprocess.Popen([*VERSIQ, "ingest", "--log-level", "DEBUG", "--warehouse", str(tmp_path / "wh"),
                             "--store", "big", "--source", str(big), "--max-future", "none"],
                            env=_client_env(driver.socket), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    assert busy.stderr is not None
    seen = []
    for line in busy.stderr:
        seen.append(line)
        if "parsed" in line:
            break
    during = ingest(driver.socket, "--warehouse", str(tmp_path / "wh"), "--store", "small", "--source", str(small))
    seen.extend(busy.stderr)
    assert busy.wait(timeout=300) == 0, "".join(seen)
    assert PID.search("".join(seen)) and int(PID.search("".join(seen)).group(1)) == driver.proc.pid  # type: ignore[union-attr]
    assert during.returncode == 0 and ran_in(during) is None, during.stderr
    assert "does not run this: it is busy with another run; running here" in during.stderr
    assert "no new files" in during.stderr
    assert len(store_versions(str(tmp_path / "wh" / "big"))) == 3000


def test_a_caller_that_goes_away_cancels_its_run_and_the_rerun_completes_it(driver, tmp_path):
    """The caller is killed while its run is in the driver: the driver cancels the run's jobs and
    keeps serving; whether or not that run committed, the next run leaves the store an
    uninterrupted run gives."""
    src = tmp_path / "src"
    make_changelog(src, files=4, keys=3000)
    client = subprocess.Popen([*VERSIQ, "ingest", "--warehouse", str(tmp_path / "wh"), "--store", "s",
                               "--source", str(src), "--max-future", "none"],
                              env=_client_env(driver.socket), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    assert client.stderr is not None
    for line in client.stderr:
        if "parsed" in line:
            break
    client.kill()
    client.wait(timeout=30)
    client.stderr.close()
    deadline = time.monotonic() + 60
    while "the run of the caller that went away has ended" not in driver.log():
        assert time.monotonic() < deadline, driver.log()
        time.sleep(0.2)
    rerun = ingest(driver.socket, "--warehouse", str(tmp_path / "wh"), "--store", "s", "--source", str(src),
                   "--max-future", "none")
    assert rerun.returncode == 0 and ran_in(rerun) == driver.proc.pid, rerun.stderr
    alone = ingest(None, "--warehouse", str(tmp_path / "alone"), "--store", "s", "--source", str(src),
                   "--max-future", "none")
    assert alone.returncode == 0, alone.stderr
    assert store_versions(str(tmp_path / "wh" / "s")) == store_versions(str(tmp_path / "alone" / "s"))
    assert _rejected(str(tmp_path / "wh" / "s")) == _rejected(str(tmp_path / "alone" / "s"))


def test_a_killed_drivers_socket_is_passed_over_and_replaced(driver, tmp_path):
    """kill -9 leaves the socket file: the CLI runs itself; a new driver takes the path over, a
    second one on a live socket is refused, and an idle driver ends by itself."""
    first = DriverProcess(str(tmp_path))
    os.killpg(first.proc.pid, signal.SIGKILL)
    first.stop()
    assert os.path.exists(first.socket)
    src = tmp_path / "src"
    write_jsonl(str(src), "a.jsonl", ['{"key":"a","value":1,"timestamp":5}'])
    (tmp_path / "wh").mkdir()
    result = ingest(first.socket, "--warehouse", str(tmp_path / "wh"), "--store", "s", "--source", str(src),
                    "--buckets", "0")  # refused before any JVM: the fallback is cheap
    assert result.returncode == 2 and ran_in(result) is None, result.stderr
    assert "no resident driver at" in result.stderr

    second = DriverProcess(str(tmp_path), "--idle-timeout", "3s")
    busy = subprocess.run([*VERSIQ, "driver", "--socket", second.socket, "--no-warm-up"], env=_driver_env(),
                          capture_output=True, text=True, timeout=120)
    assert busy.returncode == 2 and "another driver is starting or running on" in busy.stderr, busy.stderr
    assert second.proc.wait(timeout=60) == 0, second.log()
    assert "no request for 3s; stopping" in second.log()
    assert not os.path.exists(second.socket)
    second.stop()


def test_a_run_that_starts_spark_starts_a_driver_for_the_runs_after_it(tmp_path):
    """VERSIQ_DRIVER_AUTOSTART: a run with nothing to read starts no driver; a run that starts
    Spark starts one in the background (once it has ended: ``--after-pid``) and runs itself;
    the next run is the driver's; the driver ends after the variable's duration idle."""
    sock = str(tmp_path / "run" / "d.sock")
    auto = {"VERSIQ_DRIVER_AUTOSTART": "2m"}
    src, wh = tmp_path / "src", str(tmp_path / "wh")
    write_jsonl(str(src), "a.jsonl", ['{"key":"a","value":1,"timestamp":5}'])
    made = ingest(sock, "--warehouse", wh, "--store", "s", "--source", str(src))  # without the variable
    assert made.returncode == 0 and "started a resident driver" not in made.stderr, made.stderr
    nothing = ingest(sock, "--warehouse", wh, "--store", "s", "--source", str(src), extra_env=auto)
    assert nothing.returncode == 0 and "no new files" in nothing.stderr, nothing.stderr
    assert "started a resident driver" not in nothing.stderr
    assert not os.path.exists(sock) and not os.path.exists(log_path(sock))
    write_jsonl(str(src), "b.jsonl", ['{"key":"a","value":2,"timestamp":6}'])
    first = ingest(sock, "--warehouse", wh, "--store", "s", "--source", str(src), extra_env=auto)
    pid = None
    try:
        assert first.returncode == 0 and ran_in(first) is None, first.stderr
        started = re.search(r"started a resident driver \(pid (\d+)\)", first.stderr)
        assert started, first.stderr
        pid = int(started.group(1))
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            assert b"\0--idle-timeout\x002m\0" in f.read()
        deadline = time.monotonic() + 180
        while not os.path.exists(sock):
            assert time.monotonic() < deadline, open(log_path(sock)).read()
            time.sleep(0.2)
        write_jsonl(str(src), "c.jsonl", ['{"key":"a","value":3,"timestamp":7}'])
        second = ingest(sock, "--warehouse", wh, "--store", "s", "--source", str(src), extra_env=auto)
        assert second.returncode == 0 and ran_in(second) == pid, second.stderr
        assert "started a resident driver" not in second.stderr
        assert [v.value for v in store_versions(os.path.join(wh, "s"))["a"]] == ["1", "2", "3"]
        # a client without the variable matches the driver too (it is the client's setting alone)
        write_jsonl(str(src), "d.jsonl", ['{"key":"a","value":4,"timestamp":8}'])
        plain = ingest(sock, "--warehouse", wh, "--store", "s", "--source", str(src))
        assert plain.returncode == 0 and ran_in(plain) == pid, plain.stderr
        status = subprocess.run([*VERSIQ, "driver", "--socket", sock, "--status"], capture_output=True, text=True,
                                env=_driver_env(), timeout=60)
        assert status.returncode == 0 and f"pid {pid} serving on {sock}" in status.stdout, status
    finally:  # whatever failed above, the driver a run may have started is stopped
        stop = subprocess.run([*VERSIQ, "driver", "--socket", sock, "--stop"], capture_output=True, text=True,
                              env=_driver_env(), timeout=120)
    assert stop.returncode == 0 and f"pid {pid} has ended" in stop.stdout, stop
    assert not os.path.exists(sock)
    none = subprocess.run([*VERSIQ, "driver", "--socket", sock, "--status"], capture_output=True, text=True,
                          env=_driver_env(), timeout=60)
    assert none.returncode == 1 and "no driver on" in none.stdout, none


def test_a_driver_a_run_started_ends_when_a_client_runs_other_code():
    """An upgraded or edited checkout: the driver a run started for the old code ends, and the
    next run starts one for its own; a driver started by hand stays for the clients of its code.
    Another environment is not other code: it stays."""
    for started_by_a_run in (True, False):
        driver = Driver(None, "local[*]", lambda argv: None)  # type: ignore[arg-type, return-value]
        driver.end_when_outdated = started_by_a_run
        other_env = {"code": driver.code, "env": {"VERSIQ_X": "1"}, "umask": driver.umask}
        driver._handle(None, io.BytesIO(json.dumps(other_env).encode() + b"\n"))  # type: ignore[arg-type]
        assert not driver.stopping.is_set()
        probe = io.BytesIO()  # a client that connected and sent nothing (--stop, --status, autostart)
        driver._handle(None, probe)  # type: ignore[arg-type]
        assert not driver.stopping.is_set() and probe.getvalue() == b""
        other_code = {**other_env, "code": "versiq 0.0.9 elsewhere", "env": driver.environment}
        driver._handle(None, io.BytesIO(json.dumps(other_code).encode() + b"\n"))  # type: ignore[arg-type]
        assert driver.stopping.is_set() == started_by_a_run


def test_one_driver_per_socket_path_and_when_a_run_starts_one(tmp_path):
    sock = str(tmp_path / "d.sock")
    held = claim(sock)
    try:
        with pytest.raises(OSError, match="another driver is starting or running"):
            claim(sock)
        assert _driver_present(sock)  # starting: a run does not start another
        assert driver_pid(sock) == os.getpid()
    finally:
        held.close()
    assert not _driver_present(sock) and driver_pid(sock) is None
    batch = argparse.Namespace(continuous=False, master=None)
    env = {"VERSIQ_DRIVER_SOCKET": sock}
    assert autostart_hook(batch, env) is None  # the default: never
    assert autostart_hook(batch, {**env, "VERSIQ_DRIVER_AUTOSTART": "off"}) is None
    assert autostart_hook(batch, {**env, "VERSIQ_DRIVER_AUTOSTART": "soon"}) is None  # warned
    assert autostart_hook(batch, {"VERSIQ_DRIVER_SOCKET": "off", "VERSIQ_DRIVER_AUTOSTART": "5m"}) is None
    auto = {**env, "VERSIQ_DRIVER_AUTOSTART": "5m"}
    assert autostart_hook(argparse.Namespace(continuous=True, master=None), auto) is None
    assert autostart_hook(argparse.Namespace(continuous=False, master="local[1]"), auto) is None
    assert callable(autostart_hook(batch, auto))
    assert autostart_hook(batch, {**auto, "VERSIQ_DRIVER_AUTOSTART": "0s"}) is None  # zero: as off
    assert autostart_hook(batch, {**auto, "SPARK_MASTER": "spark://cluster:7077"}) is None
    assert callable(autostart_hook(batch, {**auto, "SPARK_MASTER": "local[2]"}))
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    assert start_driver(str(shared / "d.sock"), "5m") is None  # a folder others can use: never
    assert os.listdir(shared) == []


def _private_folder(path) -> str:
    path.mkdir(mode=0o700)
    path.chmod(0o700)
    return str(path / "d.sock")


def test_a_driver_opens_only_its_own_lock_file_in_a_folder_of_its_own(tmp_path):
    """The lock file is never opened through a link (another file would be truncated and get a
    pid), nor used when it is a FIFO or another user's; the socket's folder must be this user's
    alone for every driver, as for one a run starts."""
    sock = _private_folder(tmp_path / "run")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    os.symlink(victim, sock + ".lock")
    with pytest.raises(OSError):
        claim(sock)
    assert victim.read_text() == "precious"
    assert driver_pid(sock) is None
    os.remove(sock + ".lock")
    os.mkfifo(sock + ".lock", 0o600)
    with pytest.raises(OSError, match="not a regular file of this user"):
        claim(sock)  # without waiting for a writer
    os.remove(sock + ".lock")
    if os.getuid() == 0:  # only root can give a file to another user
        (tmp_path / "run" / "d.sock.lock").write_text("")
        os.chown(sock + ".lock", 54321, 54321)
        with pytest.raises(OSError, match="not a regular file of this user"):
            claim(sock)
        os.remove(sock + ".lock")
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o775)
    with pytest.raises(OSError, match="not this user's alone"):
        claim(str(shared / "d.sock"))
    assert os.listdir(shared) == []
    held = claim(sock)  # and in order: the lock is taken, the pid written
    try:
        assert driver_pid(sock) == os.getpid()
    finally:
        held.close()


@contextlib.contextmanager
def _listening(path: str):
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    try:
        yield server
    finally:
        server.close()
        os.remove(path)


def test_stop_signals_only_the_driver_that_serves_the_socket(tmp_path):
    """``--stop`` signals the pid of the lock file only when that process listens on the socket
    (or its staging name) as this user; a lock file naming another process is refused with a
    message, and that process lives on."""
    sock = _private_folder(tmp_path / "run")
    victim = subprocess.Popen(["sleep", "120"])
    try:
        with open(sock + ".lock", "wb") as lock:  # held, naming a process that is no driver
            fcntl.flock(lock, fcntl.LOCK_EX)
            lock.write(f"{victim.pid}\n".encode())
            lock.flush()
            assert driver_pid(sock) == victim.pid
            with _listening(sock):  # this test process listens, not the victim
                assert serving_problem(sock, os.getpid()) is None
                assert f"is pid {os.getpid()} of user {os.getuid()}" in (serving_problem(sock, victim.pid) or "")
                stop = subprocess.run([*VERSIQ, "driver", "--socket", sock, "--stop"], capture_output=True,
                                      text=True, env=_driver_env(), timeout=60)
            assert stop.returncode == 1, stop
            assert f"not stopping pid {victim.pid}" in stop.stderr and "not known to be this user's driver" \
                in stop.stderr, stop.stderr
            assert "no process listens on" in (serving_problem(sock, victim.pid) or "")
            with _listening(f"{sock}.{os.getpid()}"):  # a driver that is starting: its staging name
                assert serving_problem(sock, os.getpid()) is None
        assert victim.poll() is None, "the process the lock file named was signalled"
    finally:
        victim.kill()
        victim.wait()


def test_a_driver_leaves_no_staging_socket_however_its_start_ends(tmp_path):
    """The staging socket goes with the block that made it (an error included); one a driver
    killed while starting left (no process listens) is removed by the next claim, while a live
    one or another file stays."""
    sock = _private_folder(tmp_path / "run")
    with pytest.raises(RuntimeError), staged(sock) as server:
        assert os.path.exists(f"{sock}.{os.getpid()}") and server.getsockname() == f"{sock}.{os.getpid()}"
        raise RuntimeError("Spark failed to start")
    assert os.listdir(tmp_path / "run") == []
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(f"{sock}.4242")  # bound, never closed by its driver's code: killed
    dead.close()
    (tmp_path / "run" / "d.sock.notes").write_text("mine")
    with _listening(f"{sock}.4243"):
        claim(sock).close()
        assert sorted(os.listdir(tmp_path / "run")) == ["d.sock.4243", "d.sock.lock", "d.sock.notes"]


def test_a_driver_stopped_or_failing_while_starting_removes_its_socket(tmp_path):
    """A driver waiting for the run that started it (``--after-pid``) already listens under its
    staging name, so ``--stop`` can check it and stop it; it ends without starting Spark and
    leaves only its lock file. A driver whose Spark cannot start (no Java) leaves no socket."""
    sock = _private_folder(tmp_path / "run")
    run = subprocess.Popen(["sleep", "120"])  # the run that started the driver
    waiting = None
    try:
        waiting = subprocess.Popen([*VERSIQ, "driver", "--socket", sock, "--after-pid", str(run.pid), "--no-warm-up"],
                                   env=_driver_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   stdin=subprocess.DEVNULL, text=True, start_new_session=True)
        deadline = time.monotonic() + 60
        while not os.path.exists(f"{sock}.{waiting.pid}"):
            assert waiting.poll() is None and time.monotonic() < deadline, waiting.communicate()
            time.sleep(0.1)
        stop = subprocess.run([*VERSIQ, "driver", "--socket", sock, "--stop"], capture_output=True, text=True,
                              env=_driver_env(), timeout=60)
        assert stop.returncode == 0 and f"pid {waiting.pid} has ended" in stop.stdout, stop
        out, err = waiting.communicate(timeout=60)
        assert waiting.returncode == 0 and "ready on" not in out, err
        assert os.listdir(tmp_path / "run") == ["d.sock.lock"]
        assert run.poll() is None
    finally:  # whatever failed above, no driver is left waiting to start Spark
        if waiting is not None and waiting.poll() is None:
            waiting.kill()
            waiting.communicate()
        run.kill()
        run.wait()
    failing = subprocess.run([*VERSIQ, "driver", "--socket", sock, "--no-warm-up"], capture_output=True, text=True,
                             env={**_driver_env(), "JAVA_HOME": str(tmp_path / "no-java")}, timeout=120)
    assert failing.returncode != 0 and "ready on" not in failing.stdout, failing
    assert os.listdir(tmp_path / "run") == ["d.sock.lock"], failing.stderr


def test_warm_up_runs_leave_the_session_and_environment_as_they_were(spark):
    before = os.environ.get("VERSIQ_INTERPRETED_RUN_BYTES")
    warm_up(spark)
    assert os.environ.get("VERSIQ_INTERPRETED_RUN_BYTES") == before


def test_a_store_deleted_and_made_again_between_runs_is_written_afresh(driver, tmp_path):
    """The driver's session caches each table's Delta log; a store removed by hand and built
    again (same versions 0, 1, ...) is read as the new table, not the cached one."""
    src, store = tmp_path / "src", str(tmp_path / "wh" / "s")
    for round_ in ("first", "second"):
        for n in (1, 2):
            write_jsonl(str(src), f"{round_}-{n}.jsonl", [f'{{"key":"{round_}{n}","value":{n},"timestamp":{n}}}'])
            result = ingest(driver.socket, "--warehouse", str(tmp_path / "wh"), "--store", "s", "--source", str(src))
            assert result.returncode == 0 and ran_in(result) == driver.proc.pid, result.stderr
        if round_ == "first":
            assert sorted(store_versions(store)) == ["first1", "first2"]
            shutil.rmtree(store)
            for name in os.listdir(src):
                os.remove(os.path.join(src, name))
    assert sorted(store_versions(store)) == ["second1", "second2"]
    assert "-> snapshot 1 in" in result.stderr
