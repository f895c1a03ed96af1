"""The files of the installed ``versiq`` package itself: its root and its ``.py`` files,
following the links ``versiq/ingest`` → ``../ingest`` and so on (``os.walk`` does not by
default). What a cluster's executors get (``ingest.spark``) and what a resident driver's code
identity is made of (``ingest.driver_client``)."""

from __future__ import annotations

import os

import versiq


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
