"""``RoundTripBound``: the time bound of one round trip to Redis, fair to a busy event loop.

``asyncio.timeout`` fires when its time has passed, whatever kept the reply
from being read. On an event loop busy with other work (a member that fires
its whole burst at once builds a hundred requests, each a task step of a
millisecond, and a new connection's handshake needs several of the loop's
rounds), a Redis that answered in a millisecond looks slower than the
budget. The fleet then goes on alone, blind, for its back-off: the 429s a
fleet exists to prevent.

``RoundTripBound`` counts only the time Redis had. While any bound is out on
a loop, a ``LoopLag`` ticker on that loop sums how late its ticks run: the
time the loop was busy elsewhere. When the budget has passed, the bound
takes that time off; while what is left is under the budget, it waits the
rest, up to ``max(20 x budget, 1 s)`` in all, so that a dead Redis still
ends the round trip. Then it gives the reply one more round of the loop (one
that came while the loop was busy is read) before it gives up.

While replies come in time it costs one timer, cancelled, and the ticker
(a callback every few milliseconds, only while a round trip is out).
"""

from __future__ import annotations

import asyncio
import weakref
from types import TracebackType

__all__ = ["LoopLag", "RoundTripBound", "longest_s"]

# A round trip bound longer than the budget, because the loop was busy, still ends.
_MOST_BUDGETS = 20
_MOST_S = 1.0
# How often the ticker looks: a busy stretch shorter than this is not seen.
_TICK_S = 0.005


def longest_s(delay: float) -> float:
    """The longest a round trip bound to ``delay`` of Redis's time takes on a busy loop."""
    return max(_MOST_BUDGETS * delay, _MOST_S)


class LoopLag:
    """How long one event loop has been busy elsewhere, summed, while bounds are out."""

    __slots__ = ("__weakref__", "_due", "_handle", "_loop", "_users", "busy")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._users = 0
        self._due = 0.0
        self._handle: asyncio.TimerHandle | None = None
        self.busy = 0.0

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> LoopLag:
        lag = _LAGS.get(loop)
        if lag is None:
            lag = _LAGS[loop] = cls(loop)
        return lag

    def now(self) -> float:
        """``busy``, with the lateness of the tick due now, if it is."""
        return self.busy + max(0.0, self._loop.time() - self._due) if self._handle else self.busy

    def join(self) -> None:
        self._users += 1
        if self._handle is None:
            self._arm()

    def leave(self) -> None:
        self._users -= 1
        if self._users <= 0 and self._handle is not None:
            self._users = 0
            self._handle.cancel()
            self._handle = None

    def _arm(self) -> None:
        self._due = self._loop.time() + _TICK_S
        self._handle = self._loop.call_at(self._due, self._tick)

    def _tick(self) -> None:
        self.busy += max(0.0, self._loop.time() - self._due)
        self._arm()


_LAGS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopLag]
_LAGS = weakref.WeakKeyDictionary()


class RoundTripBound:
    """``async with RoundTripBound(delay):`` raises ``TimeoutError`` when Redis has had
    ``delay`` seconds (the loop's busy time left out) and the block has not ended;
    in all, busy loop included, at most ``most_s`` (default ``max(20 x delay, 1 s)``)."""

    __slots__ = (
        "_began",
        "_busy",
        "_cancelling",
        "_delay",
        "_expired",
        "_handle",
        "_lag",
        "_last",
        "_most",
        "_task",
    )

    def __init__(self, delay: float, most_s: float | None = None) -> None:
        self._delay = delay
        self._most = longest_s(delay) if most_s is None else max(most_s, delay)
        self._task: asyncio.Task[object] | None = None
        self._lag: LoopLag | None = None
        self._handle: asyncio.Handle | None = None
        self._expired = False
        self._cancelling = 0
        self._began = self._busy = self._last = 0.0

    async def __aenter__(self) -> RoundTripBound:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("RoundTripBound must be used inside a task")
        loop = task.get_loop()
        self._task, self._cancelling = task, task.cancelling()
        self._lag = lag = LoopLag.of(loop)
        lag.join()
        self._began, self._busy = loop.time(), lag.busy
        self._last = self._began + self._most
        self._handle = loop.call_later(self._delay, self._look)
        return self

    def _look(self) -> None:
        task, lag = self._task, self._lag
        if task is None or lag is None or task.done():
            return
        loop = task.get_loop()
        now = loop.time()
        had = now - self._began - (lag.now() - self._busy)  # Redis's time
        if had < self._delay and now < self._last:
            self._handle = loop.call_later(self._delay - had, self._look)
        else:
            self._handle = loop.call_soon(self._expire)  # one more round for the reply

    def _expire(self) -> None:
        task = self._task
        if task is not None and not task.done():
            self._expired = True
            task.cancel()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._lag is not None:
            self._lag.leave()
            self._lag = None
        task, self._task = self._task, None
        if not self._expired or task is None:
            return
        # The cancel this bound made is taken back first, whatever ended the block.
        if task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
            raise TimeoutError(f"no answer within {self._delay:g} s") from exc
