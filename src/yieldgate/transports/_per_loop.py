"""One connection pool per event loop, for the async transports yieldgate builds.

An httpx or httpx2 pool keeps its connections open between requests, and each
connection belongs to the event loop that opened it: used from another loop
(a second ``asyncio.run``, a new loop per test, trio after asyncio) it fails,
on asyncio with ``RuntimeError('Event loop is closed')``. ``PerLoopTransport``
builds the pool on first use in each loop and keeps one per live loop, so a
client made once keeps working whichever loop calls it.

The pool of a loop that has ended (an asyncio loop closed, a trio run
finished) is dropped when another loop first sends, not closed: closing
awaits on its loop, which can no longer run. Its sockets are closed when it
is collected, as a plain client's are when it is dropped unclosed. A loop
that is alive, running or not (``run_until_complete`` called again later),
keeps its pool.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["PerLoopTransport", "current_loop"]

# What identifies the loop when neither asyncio nor trio runs (one pool, as before).
_NO_LOOP = object()


def current_loop() -> object:
    """The running event loop: asyncio's loop, or trio's token for this run."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        pass
    trio = sys.modules.get("trio")
    if trio is not None:
        try:
            return trio.lowlevel.current_trio_token()
        except RuntimeError:
            pass
    return _NO_LOOP


def _nothing() -> None:
    pass


def _ended(loop: object) -> bool:
    """Whether ``loop`` can never run again: its pool can be neither used nor closed."""
    if isinstance(loop, asyncio.AbstractEventLoop):
        return loop.is_closed()
    trio = sys.modules.get("trio")
    if trio is not None and isinstance(loop, trio.lowlevel.TrioToken):
        try:
            # The one public way to ask whether a run is over; a live run runs a no-op.
            loop.run_sync_soon(_nothing)
        except trio.RunFinishedError:
            return True
    return False


class PerLoopTransport:
    """An async transport that sends by a transport of ``build()``'s, one per event loop."""

    def __init__(self, build: Callable[[], Any]) -> None:
        self._build = build
        self._lock = threading.Lock()  # loops of several threads may share the client
        # Replaced, never changed in place: a request reads it without the lock.
        self._pools: tuple[tuple[object, Any], ...] = ()

    def current(self) -> Any:
        """The running loop's transport, built if this loop has none yet."""
        loop = current_loop()
        for owner, transport in self._pools:
            if owner is loop:
                return transport
        with self._lock:
            for owner, transport in self._pools:
                if owner is loop:  # built by another thread's request meanwhile
                    return transport
            # A loop not seen before: the pools of loops that have ended go.
            kept = tuple(entry for entry in self._pools if not _ended(entry[0]))
            transport = self._build()
            self._pools = (*kept, (loop, transport))
            return transport

    async def handle_async_request(self, request: Any) -> Any:
        return await self.current().handle_async_request(request)

    async def aclose(self) -> None:
        """Close the running loop's pool; drop the others (their loops cannot be awaited here)."""
        loop = current_loop()
        with self._lock:
            pools, self._pools = self._pools, ()
        for owner, transport in pools:
            if owner is loop:
                await transport.aclose()
