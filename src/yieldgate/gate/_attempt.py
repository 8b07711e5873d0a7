"""One attempt of a call, and ``current_attempt()``: what the code it runs can see."""

from __future__ import annotations

import asyncio
import contextvars
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from yieldgate.gate._ledger import Attempt
from yieldgate.protocol import Priority

if TYPE_CHECKING:
    from yieldgate.gate._cost import Cost, QuotaReading

__all__ = ["CURRENT", "AttemptInfo", "current_attempt", "current_task"]


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptInfo:
    """The attempt running now in this task or thread (see ``current_attempt``).

    ``upstream`` names the member of the Gate's upstream set this attempt was
    sent to and ``target`` is what was registered for it (a URL, a client);
    both are ``None`` for a Gate without upstreams. ``hedging`` is true when
    the call may run several attempts at once (a hedge policy is set): a
    transport then keeps each attempt cancellable on its own. ``deadline`` is
    the attempt's (its timeout or the call's, whichever ends first);
    ``call_deadline`` the whole call's (``None``: no total timeout). Both are
    times on ``clock``, the Gate's clock (``time.monotonic`` unless the Gate
    was given another): use ``remaining_s`` and ``call_remaining_s``.
    """

    gate: str
    """The name of the Gate running the attempt."""
    number: int
    """The attempt's number within its call, from 1."""
    priority: Priority
    """The call's priority."""
    deadline: float | None
    """When the attempt must end, on ``clock`` (its timeout or the call's); ``None``: never."""
    upstream: str | None = None
    """The upstream it was sent to, by name; ``None`` for a Gate without upstreams."""
    target: Any = None
    """What was registered for that upstream (a URL, a client); ``None`` without upstreams."""
    hedging: bool = False
    """Whether the call may run several attempts at once (a ``HedgePolicy`` is set)."""
    call_deadline: float | None = None
    """When the whole call must end, on ``clock``; ``None``: no total timeout."""
    clock: Callable[[], float] = field(default=time.monotonic, repr=False, compare=False)
    """The Gate's clock, which the deadlines are read on (``time.monotonic`` by default)."""
    attempt: Attempt | None = field(default=None, repr=False, compare=False)
    """The Gate's own record of the attempt, which the ``report_*`` methods reach."""

    def report_usage(self, used: Cost) -> None:
        """Report what this attempt really used (its response's ``usage``), so that
        budgets of the caller's own (``QuotaPolicy.tokens_per_minute``) are settled
        against it rather than against the estimate. Safe to call after the attempt
        ended (at the end of a stream), once; a no-op outside a Gate."""
        if self.attempt is not None:
            self.attempt.used(used)

    def report_quota(self, readings: tuple[QuotaReading, ...]) -> None:
        """Report a response's quota readings (rate-limit headers) for this attempt's
        upstream. The HTTP dialects do it for every response they classify."""
        if self.attempt is not None and readings:
            self.attempt.observe(readings)

    def report_model(self, model: str) -> None:
        """Report the model the response names (its ``model`` field). A snapshot of the
        model requested (``gpt-4o-2024-08-06`` for ``gpt-4o``) spends the requested
        model's quota from now on. The HTTP transports do it for every 2xx answer."""
        if self.attempt is not None and model:
            self.attempt.answered_model(model)

    def remaining_s(self) -> float | None:
        """Seconds left for this attempt (its timeout or the call's deadline), or None."""
        if self.deadline is None:
            return None
        return max(0.0, self.deadline - self.clock())

    def call_remaining_s(self) -> float | None:
        """Seconds left of the whole call's total timeout, or None if it has none.

        What a stream carries upstream: it goes on past its attempt (its first
        chunk), within the budget the caller gave the call.
        """
        if self.call_deadline is None:
            return None
        return max(0.0, self.call_deadline - self.clock())


def current_task() -> object:
    """The running asyncio or trio task, else the running thread: where a call runs."""
    loop = asyncio._get_running_loop()
    if loop is not None:
        return asyncio.current_task(loop)  # the loop given: not looked up a second time
    trio = sys.modules.get("trio")
    if trio is not None and trio.lowlevel.in_trio_task():
        return trio.lowlevel.current_task()
    return threading.current_thread()


# Holds the running attempt; the AttemptInfo record is only built when asked for.
CURRENT: contextvars.ContextVar[Attempt | None] = contextvars.ContextVar(
    "yieldgate_attempt", default=None
)


def current_attempt() -> AttemptInfo | None:
    """The attempt this code runs under, or ``None`` outside a Gate.

    Transports read it to send the remaining budget upstream (``deadline_ms``)
    and, for a Gate over several upstreams, to learn where to send. It works
    in attempts of the async and the sync driver alike.
    """
    attempt = CURRENT.get()
    if attempt is None:
        return None
    core = attempt.core
    upstream = attempt.upstream
    named = core.named
    return AttemptInfo(
        gate=core.name,
        number=attempt.number,
        priority=attempt.priority,
        deadline=attempt.deadline,
        upstream=upstream.name if named else None,
        target=upstream.target if named else None,
        hedging=attempt.hedging,
        call_deadline=attempt.call_deadline,
        clock=core.clock,
        attempt=attempt,
    )
