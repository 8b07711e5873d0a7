"""What an ended attempt tells the window and the breaker (``CallState.end``).

Each kind of outcome has its signal for the window and its verdict for the
breaker (``SIGNALS``): a success grows the window and closes the breaker; a
yield sheds one slot and is no failure; an overload narrows the window; a
retryable error is a failure for the breaker and says nothing of load. Three
things change that, all read here and nowhere else:

- a timeout (the attempt's own, or the library's or the caller's once the
  attempt ran at least as long as the upstream usually takes) is what a
  backend that buffers instead of yielding shows under overload: congestion;
- an attempt cut at the call's deadline while it was that slow: congestion
  too (else a cancelled attempt says nothing);
- a provider's refusal of one scope's quota (a model, a deployment) says
  nothing of the upstream's load: that scope's claims are held in its lane,
  and the window the other scopes' calls share keeps its limit.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Final

from yieldgate._exceptions import AttemptTimeoutError
from yieldgate.gate._breaker import Verdict
from yieldgate.gate._outcome import Outcome, OutcomeKind
from yieldgate.gate._window import Signal

__all__ = ["SIGNALS", "judge", "timed_out"]

# What each kind of outcome tells the window and the breaker.
SIGNALS: Final = {
    OutcomeKind.OK: (Signal.SUCCESS, Verdict.SUCCESS),
    OutcomeKind.YIELD: (Signal.REFUSED, Verdict.NEUTRAL),
    OutcomeKind.OVERLOADED: (Signal.CONGESTION, Verdict.NEUTRAL),
    OutcomeKind.RETRYABLE: (Signal.FAILURE, Verdict.FAILURE),
    OutcomeKind.FATAL: (Signal.FAILURE, Verdict.NEUTRAL),
}


def timed_out(error: BaseException | None) -> bool:
    """Whether an attempt's error says it ran out of time (its own timeout, the
    library's, the caller's)."""
    if error is None:
        return False
    if isinstance(error, TimeoutError):
        return True
    for name in ("httpx", "httpx2"):
        module = sys.modules.get(name)
        if module is not None and isinstance(error, module.TimeoutException):
            return True
    return False


def judge(
    outcome: Outcome | None, *, cut: bool, slow: Callable[[], bool], spent: bool
) -> tuple[Signal, Verdict, BaseException | None]:
    """The window's signal, the breaker's verdict and the error of a sent attempt that
    ended with ``outcome`` (``None``: cancelled, or ``cut`` at the call's deadline).
    ``slow()``: whether it ran at least as long as the upstream usually takes;
    ``spent``: its outcome refuses one scope's quota."""
    if outcome is None:
        # Cut at the call's deadline while the upstream was slower than it usually
        # is: what a buffering backend shows under overload.
        signal = Signal.CONGESTION if cut and slow() else Signal.CANCELLED
        return signal, Verdict.NEUTRAL, None
    signal, verdict = SIGNALS[outcome.kind]
    if spent:
        signal = Signal.FAILURE  # one scope's quota: nothing of the upstream's load
    error = outcome.error
    if (
        error is not None
        and timed_out(error)
        and (isinstance(error, AttemptTimeoutError) or slow())
    ):
        # A timeout is what a backend that buffers instead of yielding shows under
        # overload: narrow the window as for a yield.
        signal = Signal.CONGESTION
    return signal, verdict, error
