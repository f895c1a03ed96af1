"""Waiting for a table's next snapshot without holding a thread: the catalog's refresh (a thread)
``publish``es a table's name when it loads a new snapshot of it (or the table leaves or fails),
and coroutines waiting for that (a change feed's long poll, a read's ``minSnapshot``) sleep on an
``asyncio.Event`` of their event loop until then. Idle waiters cost no thread, no poll and no
CPU, however many there are: a publish wakes all the waiters of the name at once, each looks at
the table's current snapshot again (a dictionary lookup) and waits again if it is not the one
it wants.

The order matters (``event`` docstring): take the event, then look at the snapshot, then await
the event. The refresh sets the new snapshot before it publishes, so a waiter that saw the old
snapshot holds an event the publish will set.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading


class Published:
    """The events of the coroutines waiting for the next snapshot of each table, per event loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: dict[str, dict[asyncio.AbstractEventLoop, asyncio.Event]] = {}

    def event(self, name: str) -> asyncio.Event:
        """The event the next ``publish(name)`` sets, for the running event loop. Take it *before*
        looking at the table's snapshot: a snapshot published after that look sets this event."""
        loop = asyncio.get_running_loop()
        with self._lock:
            return self._events.setdefault(name, {}).setdefault(loop, asyncio.Event())

    def publish(self, name: str) -> None:
        """Wake every coroutine waiting on ``name`` (from any thread): its snapshot moved, or the
        table left or failed. Later waiters get a new event."""
        with self._lock:
            events = self._events.pop(name, {})
        for loop, event in events.items():
            with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits there any more
                loop.call_soon_threadsafe(event.set)


async def wait_event(event: asyncio.Event, timeout_s: float) -> bool:
    """Whether ``event`` was set within ``timeout_s`` (a waiter's deadline; 0 or less: no wait)."""
    if event.is_set():
        return True
    if timeout_s <= 0:
        return False
    try:
        await asyncio.wait_for(event.wait(), timeout_s)
    except TimeoutError:
        return False
    return True
