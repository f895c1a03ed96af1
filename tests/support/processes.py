"""Processes of the tests: killing a command at a chosen moment, for the crash tests (a SIGKILL of
an ingest, then a rerun that must give the store an uninterrupted run gives); waiting for a server
process to be ready, and stopping it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable

import httpx


def run_then_kill(command: list[str], env: dict[str, str], marker: str | None, delay: float) -> int:
    """Start ``command`` in its own process group; SIGKILL the group ``delay`` s after ``marker``
    appears in its standard error (or after the start when ``marker`` is None). Returns the exit
    status (negative: killed)."""
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    assert proc.stderr is not None
    try:
        if marker is not None:
            for line in proc.stderr:
                if marker in line:
                    break
        time.sleep(delay)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.stderr.close()


def wait_until_ready(process: subprocess.Popen, base_url: str, timeout: float = 60.0,
                     why: Callable[[], str] = lambda: "") -> None:
    """Wait until ``base_url``/readyz answers 200 while ``process`` (a server) runs; fail with
    ``why()`` (e.g. its log) when it exits or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while True:
        assert process.poll() is None, f"the server exited (status {process.returncode}) {why()}"
        try:
            if httpx.get(f"{base_url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, f"the server was not ready within {timeout:g} s {why()}"
        time.sleep(0.25)


def stop(process: subprocess.Popen, timeout: float = 20.0) -> None:
    """SIGTERM, then SIGKILL after ``timeout`` s; waits for the exit."""
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=timeout)


def java_binary(error: type[Exception]) -> str:
    """The ``java`` of ``JAVA_HOME``, else the one on ``PATH``; ``error`` when there is none."""
    home = os.environ.get("JAVA_HOME")
    if home and os.access(os.path.join(home, "bin", "java"), os.X_OK):
        return os.path.join(home, "bin", "java")
    java = shutil.which("java")
    if java is None:
        raise error("java is not on PATH (Java 17 or later is needed: make java)")
    return java
