"""The kernel's file notifications (inotify, through ``watchfiles``) as one thing to wait on.

Both halves poll less because of it: continuous ingest over local folders starts a run when a
file lands (``ingest.watch``), and the service refreshes a store when its next commit
lands (``query.catalog``). A thread waits on watchfiles' Rust watcher (``RustNotify``, used
directly as watchfiles documents) and sets an event whenever changes come; ``wait`` returns at the
first one, at ``wake()``, or after its timeout, whatever happened, so a caller always looks at the
files themselves: a notification only says *when* to look. The watches are set up in the thread,
a moment after the object is made: the first wake-up comes once they are, so a caller that looks
again then has missed nothing that happened meanwhile. The watcher waits without a timeout: its
return on a timeout clears the changes it has collected after it looked at them, so a change that
arrived in between was lost (and a waiter slept through a file that landed). Where the kernel
cannot notify (a path that does not exist yet, a file system without inotify, too many watches)
``notified`` turns False, with one warning, and the caller polls at its own interval instead.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from watchfiles._rust_notify import RustNotify

log = logging.getLogger("versiq.notify")

#: What the thread waits, after a change, for more before it wakes the waiter: a file renamed into
#: place is one change; a file copied in is many, and the waiter is better woken once the writes
#: have stopped.
SETTLE_MS = 10
#: The longest it groups the changes of paths that keep changing before it wakes the waiter.
GROUP_MS = 200


class FileChanges:
    """Changes under ``paths`` (recursively), optionally only those ``keep(path)`` accepts."""

    def __init__(self, paths: list[str], what: str, keep: Callable[[str], bool] | None = None) -> None:
        self._changed = threading.Event()
        self._closing = threading.Event()
        self._what = what
        self.notified = True
        self._thread = threading.Thread(target=self._watch, args=(paths, keep), name="versiq-file-changes",
                                        daemon=True)
        self._thread.start()

    def _watch(self, paths: list[str], keep: Callable[[str], bool] | None) -> None:
        try:
            with _rust_watcher(paths) as watcher:
                self._changed.set()  # the watches are set up
                while not self._closing.is_set():
                    changes = watcher.watch(GROUP_MS, SETTLE_MS, 0, self._closing)
                    if isinstance(changes, set) and any(keep is None or keep(path) for _change, path in changes):
                        self._changed.set()
        except Exception as exc:  # noqa: BLE001 - a missing path, no inotify, too many watches: poll instead
            if not self._closing.is_set():
                log.warning("no file notifications for %s (%s: %s); polling instead", self._what,
                            type(exc).__name__, exc)
        self.notified = False
        self._changed.set()

    def wait(self, timeout_s: float) -> bool:
        """Until a change, ``wake()`` or ``timeout_s``; then clear, so that what happens from now
        on wakes the next wait (the caller looks at the files next). True when woken early."""
        woken = self._changed.wait(timeout_s)
        self._changed.clear()
        return woken

    def wake(self) -> None:
        self._changed.set()

    def close(self) -> None:
        self._closing.set()
        self._thread.join(timeout=10)


def _rust_watcher(paths: list[str]) -> RustNotify:
    """watchfiles' Rust watcher over ``paths`` (recursive), with the choices ``watchfiles.watch``
    makes from the environment: polling on WSL, where inotify misses changes made from Windows,
    and the ``WATCHFILES_*`` variables."""
    from watchfiles._rust_notify import RustNotify
    from watchfiles.main import _default_force_polling, _default_ignore_permission_denied, _default_poll_delay_ms

    return RustNotify(paths, False, _default_force_polling(None), _default_poll_delay_ms(300), True,
                      _default_ignore_permission_denied(None))
