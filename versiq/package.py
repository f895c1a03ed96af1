"""The files of the installed ``versiq`` package itself: its root and its ``.py`` files,
following the links ``versiq/ingest`` → ``../ingest`` and so on (``os.walk`` does not by
default), and the folder of jars its Spark sessions load. What a cluster's executors get
(``ingest.spark``) and what a resident driver's code identity is made of
(``ingest.driver_client``). Kept free of Spark: a client of the resident driver imports it."""

from __future__ import annotations

import glob
import os

import versiq
from versiq import settings


def package_root() -> str:
    """The folder of the ``versiq`` package."""
    return os.path.dirname(os.path.abspath(versiq.__file__ or ""))


def package_files() -> list[str]:
    """Every ``.py`` file of the package (absolute paths, links followed), in a stable order."""
    out: list[str] = []
    for folder, dirs, files in os.walk(package_root(), followlinks=True):
        dirs.sort()
        out.extend(os.path.join(folder, name) for name in sorted(files) if name.endswith(".py"))
    return out


#: The environment variable naming a folder of Delta's jars (else ``.cache/jars`` of the checkout).
JARS_DIR_ENV = settings.SPARK_JARS.name


def jars_dir() -> str | None:
    """The folder of fetched jars a Spark session loads (``ingest.spark``):
    ``VERSIQ_SPARK_JARS``, else ``.cache/jars`` of the checkout this package runs from; None when
    neither holds Delta's connector."""
    root = os.path.dirname(os.path.dirname(os.path.realpath(versiq.__file__ or "")))
    for folder in (settings.SPARK_JARS.value(), os.path.join(root, ".cache", "jars")):
        if folder and glob.glob(os.path.join(folder, "delta-spark_*.jar")):
            return folder
    return None


def jar_files(folder: str | None = None) -> list[str]:
    """The jars of ``folder`` (default: ``jars_dir()``) a session hands to Spark, in a stable
    order; none without a folder (Spark then resolves them by Maven coordinates)."""
    where = folder if folder is not None else jars_dir()
    return sorted(glob.glob(os.path.join(where, "*.jar"))) if where else []
