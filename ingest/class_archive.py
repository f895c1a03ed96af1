"""The driver JVM's class-data-sharing archive: an optimisation, never a requirement.

A JVM started with ``-XX:SharedArchiveFile`` maps the classes every Spark start loads (Scala,
Spark SQL, Hadoop, Delta's commit, Parquet's writer) from an archive instead of parsing and
verifying them again (docs/benchmarks.md has the figures). Java 17 writes such a "dynamic"
archive when a JVM started with ``-XX:ArchiveClassesAtExit`` exits.

The contract:
- **Best effort.** ``write_class_archive`` never raises and never fails a command: when the JVM
  cannot write the archive in time, or fails, it logs one line, kills its own process group (the
  Python child and the JVM it started), removes its partial file, and returns None. Spark then
  starts without an archive, as it does anywhere none was written (a wheel installed elsewhere).
- **Only whole archives are used.** A truncated archive crashes the JVM (SIGBUS), so an archive is
  used only under its final name, which it gets by a rename once the JVM that wrote it has exited.
- **Never a stale one.** Its name carries the Java binary, PySpark's version and
  ``CLASS_ARCHIVE_RECIPE``: another JDK, Spark or recipe gets another file.

What the writing JVM runs is the resident driver's warm-up (``ingest.warm_up``): runs parsed and
decided in the driver (interpreted expressions, one write task), and a run parsed by Spark tasks
and decided by Spark (generated code, Python workers' Arrow exchange), so the archive holds the
classes of both kinds of run.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile

import pyspark

import versiq
from versiq import settings

log = logging.getLogger(__name__)

#: Extra options of the driver JVM (e.g. ``-XX:ArchiveClassesAtExit=FILE`` for ``write_class_archive``).
DRIVER_JAVA_OPTIONS_ENV = settings.DRIVER_JAVA_OPTIONS.name
#: The environment variable naming the folder of the driver's class-data-sharing archive.
CLASS_ARCHIVE_DIR_ENV = settings.JVM_ARCHIVE_DIR.name

#: The archive's contents change with what the writing JVM runs: a new recipe, a new file.
CLASS_ARCHIVE_RECIPE = 10

#: How long ``write_class_archive`` waits by default for the JVM that writes the archive (a
#: loaded 2-core machine takes minutes; the archive is then skipped, never waited for longer).
WRITE_TIMEOUT_S = 300.0

#: A record of the last attempt beside the archives: ``written``, ``timeout`` or ``failed`` and
#: one line (the tests tell a broken recipe from a busy machine by it).
OUTCOME_FILE = "last-attempt"

#: What the archive's JVM runs, in a child process (nothing here imports the pipeline).
_CLASS_ARCHIVE_SCRIPT = """
import os
from versiq.ingest.spark import get_spark
from versiq.ingest.warm_up import warm_up
from versiq.settings import INTERPRETED_RUN_BYTES, PARSE_HERE_BYTES

os.environ.pop(INTERPRETED_RUN_BYTES.name, None)
os.environ.pop(PARSE_HERE_BYTES.name, None)
spark = get_spark('local[1]', 'versiq-class-archive')
warm_up(spark)
gateway = spark.sparkContext._gateway
spark.stop()
proc = gateway.proc
gateway.shutdown()
proc.stdin.close()  # the JVM exits when its stdin closes; it writes the archive as it exits
proc.wait(timeout=120)
"""


def _java_identity() -> str:
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not java or not os.path.exists(java):
        return ""
    real = os.path.realpath(java)
    stat = os.stat(real)
    return f"{real}:{stat.st_size}:{int(stat.st_mtime)}"


def class_archive_path() -> str | None:
    """Where the driver's class-data-sharing archive of this JDK and PySpark lives:
    ``VERSIQ_JVM_ARCHIVE_DIR``, else ``.cache/jvm`` of the checkout this package runs from;
    None when no Java is found."""
    identity = _java_identity()
    if not identity:
        return None
    root = os.path.dirname(os.path.dirname(os.path.realpath(versiq.__file__ or "")))
    folder = settings.JVM_ARCHIVE_DIR.value() or os.path.join(root, ".cache", "jvm")
    digest = hashlib.sha256(f"{identity}\0{pyspark.__version__}\0{CLASS_ARCHIVE_RECIPE}".encode()).hexdigest()[:16]
    return os.path.join(folder, f"spark-driver-{digest}.jsa")


def class_archive_option() -> str | None:
    """The JVM option that maps the archive, when a whole one exists; else None."""
    path = class_archive_path()
    return f"-XX:SharedArchiveFile={path}" if path is not None and os.path.isfile(path) else None


def last_attempt(folder: str) -> tuple[str, str] | None:
    """``(outcome, line)`` of the last ``write_class_archive`` in ``folder``, if any."""
    try:
        with open(os.path.join(folder, OUTCOME_FILE), encoding="utf-8") as handle:
            outcome, _, line = handle.read().strip().partition(" ")
    except OSError:
        return None
    return outcome, line


def write_class_archive(timeout: float = WRITE_TIMEOUT_S) -> str | None:
    """Write the archive when missing, from a JVM in a child process of its own process group;
    returns its path, or None when none could be written within ``timeout`` seconds. Never raises:
    every failure is one logged line, after which the child's process group is gone and no
    partial file is left (also none of an earlier attempt that was killed)."""
    path = class_archive_path()
    if path is None or os.path.isfile(path):
        return path
    folder = os.path.dirname(path)
    try:
        os.makedirs(folder, exist_ok=True)
        _remove_abandoned_partials(path)
        outcome, line = _write(path, timeout)
    except OSError as error:  # a folder that cannot be written: no archive, nothing to clean
        outcome, line = "failed", f"the JVM class archive was not written ({error}); Spark starts without one"
    if outcome != "written":
        log.warning("%s", line)
    with contextlib.suppress(OSError), open(os.path.join(folder, OUTCOME_FILE), "w", encoding="utf-8") as handle:
        handle.write(f"{outcome} {line}\n")
    return path if outcome == "written" else None


def _write(path: str, timeout: float) -> tuple[str, str]:
    partial = f"{path}.{os.getpid()}.partial"
    env = {**os.environ, DRIVER_JAVA_OPTIONS_ENV: f"-XX:ArchiveClassesAtExit={partial}",
           CLASS_ARCHIVE_DIR_ENV: os.path.join(os.path.dirname(path), "none")}  # not the archive being written
    # The child's output goes to a file, not a pipe: a JVM that outlived its parent would hold a
    # pipe open and keep a reader waiting.
    with tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace") as output:
        child = subprocess.Popen([sys.executable, "-c", _CLASS_ARCHIVE_SCRIPT], env=env, stdin=subprocess.DEVNULL,
                                 stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = child.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            _kill_group(child)
            with contextlib.suppress(FileNotFoundError):
                if not (child.returncode == 0 and os.path.getsize(partial) > 0):
                    os.remove(partial)
        if code is None:
            return "timeout", (f"the JVM class archive was not written within {timeout:g} s (a busy machine?); "
                               "Spark starts without one")
        if code != 0 or not os.path.isfile(partial):
            output.seek(0)
            tail = output.read()[-2000:].strip().splitlines()
            return "failed", (f"the JVM class archive could not be written (exit {code}: "
                              f"{tail[-1] if tail else 'no output'}); Spark starts without one")
        os.replace(partial, path)
        return "written", path


def _kill_group(child: subprocess.Popen[bytes]) -> None:
    """SIGKILL the child's process group (the Python child and the JVM it started; a JVM busy
    writing its archive may ignore SIGTERM for minutes) and reap the child."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signal.SIGKILL)
    child.wait()


def _remove_abandoned_partials(path: str) -> None:
    """Partial archives of attempts whose process is gone (killed before it could clean up)."""
    for partial in glob.glob(f"{glob.escape(path)}.*.partial"):
        pid = partial[len(path) + 1:-len(".partial")]
        if pid.isdigit() and not _alive(int(pid)):
            with contextlib.suppress(FileNotFoundError):
                os.remove(partial)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
