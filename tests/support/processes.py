"""Killing a command at a chosen moment, for the crash tests (a SIGKILL of an ingest, then a rerun
that must give the store an uninterrupted run gives)."""

from __future__ import annotations

import os
import signal
import subprocess
import time


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
