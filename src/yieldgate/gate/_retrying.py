"""The retry loop on tenacity, through its own doors: strategies that ask the core.

Both drivers run a call's retries on tenacity (``AsyncRetrying`` for asyncio
and trio, ``Retrying`` for threads) built from the same four strategies, each
a question put to the call's ``CallState``:

- ``retry=``: does this outcome need another attempt (not a success, not fatal)?
- ``wait=``: the core's decision: after how long (a hint with its jitter, a
  backoff, zero when a shared hold is the wait), or stop (a reason is set);
- ``stop=``: has the decision just made been to stop?
- ``before_sleep=``: count the retry and report the wait to telemetry.

tenacity asks ``wait`` before ``stop``, so the decision is made once, in
``wait``, and ``stop`` reads it. The first attempt runs inline (most calls
never retry, and tenacity per call would double the Gate's cost), so the
first retry's decision is asked of the same strategies before tenacity
takes over the attempts that follow: one decision path for both drivers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from tenacity import AsyncRetrying, RetryCallState, Retrying
from tenacity.retry import retry_base
from tenacity.stop import stop_base
from tenacity.wait import wait_base

from yieldgate.gate._call import CallState
from yieldgate.gate._outcome import Outcome, OutcomeKind

__all__ = ["Strategies", "needs_retry"]


def needs_retry(outcome: Outcome) -> bool:
    """Whether an outcome calls for another attempt: not a success, not fatal."""
    return outcome.kind is not OutcomeKind.OK and outcome.kind is not OutcomeKind.FATAL


def _outcome(state: RetryCallState) -> Outcome:
    assert state.outcome is not None
    outcome: Outcome = state.outcome.result()
    return outcome


class _Unfinished(retry_base):
    def __call__(self, retry_state: RetryCallState) -> bool:
        return needs_retry(_outcome(retry_state))


class _Decided(wait_base):
    def __init__(self, call: CallState) -> None:
        self.call = call

    def __call__(self, retry_state: RetryCallState) -> float:
        call = self.call
        return call.decide(_outcome(retry_state), call.core.clock())


class _Stopped(stop_base):
    def __init__(self, call: CallState) -> None:
        self.call = call

    def __call__(self, retry_state: RetryCallState) -> bool:
        return self.call.stop_error is not None


class Strategies:
    """tenacity's strategies for one call, and the retryers built from them."""

    __slots__ = ("before_sleep", "call", "retry", "stop", "wait")

    def __init__(self, call: CallState) -> None:
        self.call = call
        self.retry = _Unfinished()
        self.wait = _Decided(call)
        self.stop = _Stopped(call)
        self.before_sleep = self._before_sleep

    def _before_sleep(self, retry_state: RetryCallState) -> None:
        self.call.before_wait(_outcome(retry_state))

    def first_wait(self, outcome: Outcome) -> float | None:
        """The decision after the inline first attempt: the wait, or ``None`` to stop."""
        call = self.call
        wait = call.decide(outcome, call.core.clock())
        if call.stop_error is not None:
            return None
        call.before_wait(outcome)
        return wait

    def retrying(self, sleep: Callable[[float], None]) -> Retrying:
        return Retrying(
            sleep=sleep,
            retry=self.retry,
            wait=self.wait,
            stop=self.stop,
            before_sleep=self.before_sleep,
            retry_error_callback=_outcome,
            reraise=True,
        )

    def async_retrying(self, sleep: Callable[[float], Awaitable[Any]]) -> AsyncRetrying:
        return AsyncRetrying(
            sleep=sleep,
            retry=self.retry,
            wait=self.wait,
            stop=self.stop,
            before_sleep=self.before_sleep,
            retry_error_callback=_outcome,
            reraise=True,
        )
