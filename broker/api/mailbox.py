"""Wake-ups for agents' long polls: the engine (another thread of the same process) calls
notify(node) after writing something that node's agent should see; a poll waiting for that
node returns at once instead of at its next check."""

from __future__ import annotations

import asyncio
import contextlib


class Mailbox:
    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._events: dict[str, asyncio.Event] = {}

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Attach to the server's event loop (done at start-up)."""
        self._loop = loop

    def notify(self, node: str) -> None:
        """Thread-safe: wake the polls waiting for `node` (nothing if none)."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop is shutting down
                loop.call_soon_threadsafe(self._set, node)

    def notify_all(self) -> None:
        """Thread-safe: wake every waiting poll (each reads the database once)."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._set_all)

    def _set_all(self) -> None:
        for ev in self._events.values():
            ev.set()

    def _set(self, node: str) -> None:
        ev = self._events.get(node)
        if ev is not None:
            ev.set()

    async def wait(self, node: str, timeout: float) -> None:
        """Return when notified for `node` or after `timeout` seconds."""
        ev = self._events.setdefault(node, asyncio.Event())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ev.wait(), timeout)
        ev.clear()
