"""Hedging: a second attempt for a call whose first is slow to answer.

Tail latency comes from the few attempts that land on a slow replica, a long
batch or a cold cache. A hedge starts another attempt once the first has not
answered within a delay (fixed, or a quantile of the latencies seen
recently), and the first success wins; the others are cancelled at once. A
hedge runs only where the window has a free slot, the retry budget allows a
retry and no upstream hint is being waited out, so hedging can never add load
to an upstream that is already saying it has too much.

Hedging is the async driver's: a losing attempt is cancelled the moment
another wins, which a coroutine allows and a thread does not (a blocking
call in a thread cannot be interrupted, so a loser would run to its end,
costing the upstream the work hedging means to save). The sync driver
ignores the hedge policy.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio

from yieldgate._exceptions import YieldgateError
from yieldgate.gate._outcome import Outcome, OutcomeKind

if TYPE_CHECKING:
    from yieldgate.gate._attempt import Slot
    from yieldgate.gate._call import CallState

__all__ = ["HedgePolicy", "LatencyTracker", "hedged_round"]


@dataclass(frozen=True, slots=True, kw_only=True)
class HedgePolicy:
    """When a Gate starts extra attempts for a call that has not answered yet.

    ``max_hedges`` extra attempts at most per round of attempts (one round per
    retry). The delay before each is ``delay_s`` when given; otherwise the
    ``quantile`` of the last ``samples`` successful attempt latencies (the time
    to the value, or to the first chunk of a stream), once ``min_samples``
    have been seen, and ``initial_delay_s`` until then; never less than
    ``min_delay_s``.
    """

    max_hedges: int = 1
    delay_s: float | None = None
    quantile: float = 0.95
    initial_delay_s: float = 1.0
    min_delay_s: float = 0.01
    min_samples: int = 20
    samples: int = 200

    def __post_init__(self) -> None:
        if self.max_hedges < 1:
            raise ValueError("max_hedges must be >= 1")
        for name in ("initial_delay_s", "min_delay_s"):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number >= 0")
        if self.delay_s is not None and not (self.delay_s >= 0 and math.isfinite(self.delay_s)):
            raise ValueError("delay_s must be a finite number >= 0 or None")
        if not 0 < self.quantile < 1:
            raise ValueError("quantile must be between 0 and 1 (exclusive)")
        if self.min_samples < 1:
            raise ValueError("min_samples must be >= 1")
        if self.samples < self.min_samples:
            raise ValueError("samples must be >= min_samples")

    @classmethod
    def fixed(cls, delay_s: float, *, max_hedges: int = 1) -> HedgePolicy:
        """Hedge after a fixed ``delay_s``."""
        return cls(delay_s=delay_s, max_hedges=max_hedges)


class LatencyTracker:
    """Recent successful latencies: their quantiles, and a moving average.

    Only attempts that answered are measured; a hedged attempt cancelled as a
    loser is not, so the quantile leans towards the faster attempts.
    """

    __slots__ = ("_recent", "_sorted", "ewma_s")

    def __init__(self, size: int = 200) -> None:
        self._recent: deque[float] = deque(maxlen=size)
        self._sorted: list[float] | None = None
        self.ewma_s: float | None = None

    def __len__(self) -> int:
        return len(self._recent)

    def record(self, seconds: float) -> None:
        self._recent.append(seconds)
        self._sorted = None
        self.ewma_s = seconds if self.ewma_s is None else 0.8 * self.ewma_s + 0.2 * seconds

    def record_at_least(self, seconds: float) -> None:
        """An attempt cancelled after ``seconds`` without answering (a hedge's loser):
        its latency was at least that. It moves the average up, never down, and
        stays out of the quantiles, which hold only answers."""
        if self.ewma_s is None or seconds > self.ewma_s:
            self.ewma_s = seconds if self.ewma_s is None else 0.8 * self.ewma_s + 0.2 * seconds

    def quantile(self, q: float) -> float | None:
        """The ``q`` quantile of the recent latencies (nearest rank), or None if empty."""
        if not self._recent:
            return None
        if self._sorted is None:
            self._sorted = sorted(self._recent)
        values = self._sorted
        rank = min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))
        return values[rank]


async def hedged_round(
    call: CallState, first: Slot, send: Callable[[Slot], Awaitable[Outcome]]
) -> Outcome:
    """The first attempt, plus a hedge each time it (and the hedges so far) stay
    unanswered past the delay; the first success wins and the rest are cancelled."""
    hedge = call.hedge
    assert hedge is not None
    clock = call.core.clock
    outcomes: list[Outcome] = []
    errors: list[YieldgateError] = []
    # Anything else an attempt raised (a classifier's bug, say): raised as
    # is, as it would be without hedging, never wrapped in a group.
    crashes: list[Exception] = []
    settled = anyio.Event()
    running = 0

    async def run(slot: Slot, scope: anyio.CancelScope) -> None:
        nonlocal running
        try:
            outcomes.append(await send(slot))
        except YieldgateError as exc:
            errors.append(exc)  # the deadline passed during this attempt
        except Exception as exc:
            crashes.append(exc)
            scope.cancel()
            settled.set()
            return
        finally:
            running -= 1
        if call.winner is not None:
            scope.cancel()  # the losers: their window slots come back at once
            settled.set()
        elif running == 0:
            settled.set()

    async with anyio.create_task_group() as tg:
        running = 1
        tg.start_soon(run, first, tg.cancel_scope)
        hedges = 0
        while hedges < hedge.max_hedges and not settled.is_set():
            with anyio.move_on_after(call.hedge_delay(first.upstream)):
                await settled.wait()
            if settled.is_set() or call.hedging_off:
                break
            slot = call.admit_hedge(clock())
            if slot is None:
                continue  # no room to hedge now; look again after another delay
            hedges += 1
            running += 1
            tg.start_soon(run, slot, tg.cancel_scope)
    if crashes:
        raise crashes[0]
    winner = call.winner
    if winner is not None:
        if winner.slot is not first:
            with call.core.lock:
                call.core.counters.hedge_wins += 1
        assert call.won is not None
        return call.won
    if not outcomes:
        raise errors[0]
    # No success: what the retry loop should act on. A fatal outcome ends the
    # call only when every attempt was fatal; a congestion carries the hint.
    usable = [o for o in outcomes if o.kind is not OutcomeKind.FATAL] or outcomes
    congested = [o for o in usable if o.is_congestion]
    return (congested or usable)[-1]
