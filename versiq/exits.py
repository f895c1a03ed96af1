"""Exit statuses of every ``versiq`` command: one definition for the CLI, ingest and serve.

- ``OK`` (0): success (rejected records do not change it).
- ``FAILED`` (1): a store, stream or derived table failed (its report entry has ``error``; the
  others' runs stand), or a source could not be read; ``versiq driver --status``/``--stop``
  found no driver (or ``--stop`` found that the lock file's pid does not serve the socket).
- ``USAGE`` (2): a usage or configuration error found before any data is touched.
- ``SERVE_FAILED`` (3): ``versiq serve`` could not start serving, e.g. its address is in use
  (uvicorn's own startup-failure status, kept so supervisors can tell it from a usage error).
- ``NO_VALUE`` (4): ``versiq get`` found no value for the key (*not found* or *expired*; the
  problem object is printed).
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_SERVE_FAILED = 3
EXIT_NO_VALUE = 4
