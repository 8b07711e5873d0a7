"""Hedging: a second attempt for a call whose first is slow to answer.

Tail latency comes from the few attempts that land on a slow replica, a long
batch or a cold cache. A hedge starts another attempt once the first has not
answered within a delay (fixed, or a quantile of the latencies seen
recently), and the first success wins; the others are cancelled at once. A
hedge is admitted by the same steps as any attempt (``_admission_hedge``:
the quota, the fleet's take and in-flight lease, a window slot with the rate
cap's start, a closed breaker), each taken at once or not at all, plus a
draw from the retry budget; it runs only where no upstream hint is being
waited out, so hedging can never add load to an upstream that is already
saying it has too much. Each hedge's ledger is its own, closed by the task
that runs it, whatever ends it.

Hedging is the async driver's: a losing attempt is cancelled the moment
another wins, which a coroutine allows and a thread does not (a blocking
call in a thread cannot be interrupted, so a loser would run to its end,
costing the upstream the work hedging means to save). The sync driver
ignores the hedge policy.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from typing import TYPE_CHECKING, Any

import anyio

from yieldgate._exceptions import YieldgateError
from yieldgate.gate import _admission as admission
from yieldgate.gate._admission_hedge import hedge as admit_hedge
from yieldgate.gate._outcome import Outcome, OutcomeKind
from yieldgate.gate._policy import HedgePolicy

if TYPE_CHECKING:
    from yieldgate.gate._call import CallState
    from yieldgate.gate._ledger import Attempt

__all__ = ["HedgePolicy", "hedged_round"]

Send = Callable[["Attempt", bool], Awaitable[Outcome]]
Drive = Callable[["CallState", Generator[admission.Wait, Any, Any]], Awaitable[Any]]


async def hedged_round(
    call: CallState, first: Attempt, waited: bool, send: Send, drive: Drive
) -> Outcome:
    """The first attempt, plus a hedge each time it (and the hedges so far) stay
    unanswered past the delay; the first success wins and the rest are cancelled."""
    hedge = call.hedge
    assert hedge is not None
    core = call.core
    outcomes: list[Outcome] = []
    errors: list[YieldgateError] = []
    # Anything else an attempt raised (a classifier's bug, say): raised as
    # is, as it would be without hedging, never wrapped in a group.
    crashes: list[Exception] = []
    settled = anyio.Event()
    running = 0

    async def run(attempt: Attempt, waited: bool, scope: anyio.CancelScope) -> None:
        nonlocal running
        try:
            outcomes.append(await send(attempt, waited))
        except YieldgateError as exc:
            errors.append(exc)  # the deadline passed during this attempt
        except Exception as exc:
            crashes.append(exc)
            scope.cancel()
            settled.set()
            return
        finally:
            running -= 1
            if not attempt.ended:  # cancelled before it was sent: its ledger closes here
                call.end(attempt, None, core.clock())
        if call.winner is not None:
            scope.cancel()  # the losers: their window slots come back at once
            settled.set()
        elif running == 0:
            settled.set()

    spawned = [first]
    try:
        async with anyio.create_task_group() as tg:
            running = 1
            tg.start_soon(run, first, waited, tg.cancel_scope)
            hedges = 0
            while hedges < hedge.max_hedges and not settled.is_set():
                with anyio.move_on_after(call.hedge_delay(first.upstream)):
                    await settled.wait()
                if settled.is_set() or call.hedging_off:
                    break
                extra = call.attempt()
                spawned.append(extra)
                if not await drive(call, admit_hedge(call, extra)):
                    call.end(extra, None, core.clock())
                    continue  # no room to hedge now; look again after another delay
                hedges += 1
                running += 1
                tg.start_soon(run, extra, True, tg.cancel_scope)
    finally:
        for attempt in spawned:  # one whose task never ran: its ledger closes here
            if not attempt.ended:
                call.end(attempt, None, core.clock())
    if crashes:
        raise crashes[0]
    winner = call.winner
    if winner is not None:
        if winner is not first:
            with core.lock:
                core.counters.hedge_wins += 1
        assert call.won is not None
        return call.won
    if not outcomes:
        raise errors[0]
    # No success: what the retry loop should act on. A fatal outcome ends the
    # call only when every attempt was fatal; a congestion carries the hint.
    usable = [o for o in outcomes if o.kind is not OutcomeKind.FATAL] or outcomes
    congested = [o for o in usable if o.is_congestion]
    return (congested or usable)[-1]
