"""A virtual-time asyncio loop: sleeps and timeouts complete at once, in order.

When nothing is ready and the loop would block until its next timer, it moves
its clock forward to that timer instead of waiting. Every anyio primitive
(sleep, deadlines, the Gate's clock) reads the loop's clock, so tests of
backoff, timeouts and breakers run instantly and deterministically while the
code under test runs unchanged. Real I/O still works (polled without
blocking), but these tests use none.
"""

from __future__ import annotations

import asyncio
import selectors
from typing import Any

_ITERATION_S = 1e-6


class _FastForwardSelector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    loop: VirtualTimeLoop

    def select(self, timeout: float | None = None) -> list[Any]:
        ready: list[Any] = super().select(0)
        if ready or timeout == 0:
            # A real loop iteration takes time too; without this, code that
            # re-arms a timer at "now plus a rounding error" would spin forever.
            self.loop.advance(_ITERATION_S)
            return ready
        if timeout is None:
            # No timer pending: only I/O (or another thread) can wake the loop.
            return super().select(0.01)  # type: ignore[no-any-return]
        self.loop.advance(timeout)
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self._virtual_now = 0.0
        selector = _FastForwardSelector()
        selector.loop = self
        super().__init__(selector)

    def time(self) -> float:
        return self._virtual_now

    def advance(self, seconds: float) -> None:
        self._virtual_now += seconds


def gates_read_the_loop_clock(monkeypatch: Any) -> None:
    """Make Gates built from now on read the event loop's (virtual) clock.

    In production a Gate reads ``time.monotonic`` (which asyncio's clock is
    too), so that threads and event loops share one timeline; under virtual
    time the loop's clock is the only one that moves.
    """
    import anyio

    import yieldgate.gate._gate

    monkeypatch.setattr(yieldgate.gate._gate, "default_clock", anyio.current_time)
