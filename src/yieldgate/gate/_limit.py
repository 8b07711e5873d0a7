"""The window's limit: congestion control in the manner of TCP, for requests in flight.

- **Slow start.** The limit starts at ``initial`` (8, or ``max`` if that is
  lower) and grows by one per success, doubling per round trip, until the
  first congestion signal or ``max``. A backend sees a ramp, not a wall,
  without a burst idling most of it for the first round trips (which, for an
  LLM, last seconds): a governed server refuses the excess of a first round at
  once, and a buffering one batches eight requests without noticing.
  ``GatePolicy.cold_start()`` begins at one for a backend known to be fragile.
- **Additive increase.** Past the slow-start threshold, each success adds
  ``increase / limit``: about ``increase`` per window of successes.
- **Exact decrease on refusal.** A ``yield`` is the upstream saying, before
  doing any work, that this one attempt was one too many: the limit sheds
  exactly one slot per refused attempt (eight refusals from a slow-start
  overshoot shed eight). A multiplicative cut would idle a share of an honest
  server's slots after every probe. Refusals end slow start where they leave
  the limit, except when they empty the window (a cold or briefly full
  upstream refused everything): then the threshold is the limit the event
  met, cut by ``decrease``, and the window climbs back by slow start, not one
  slot per round trip.
- **Multiplicative decrease.** Other congestion (an overload that may have
  cost the upstream work, an attempt that timed out on a buffering backend)
  multiplies the limit by ``decrease``, at most once per window: signals from
  permits granted before the last decrease belong to the same congestion
  event (a burst of 50 timeouts shrinks the window once, not 50 times).
- **A plateau where it hurt.** Growth slows to a quarter near the limit at
  which congestion last came, so the window probes that level rarely (each
  probe costs a refused attempt) and grows at the usual pace once past it.
- **Growth needs demand.** Only permits that were part of a full window (the
  limit bound at or after their grant: it was full, or callers waited) make
  it grow, so a quiet spell cannot inflate it, while a busy round counts in
  full.

``Limit`` is plain arithmetic on the signals attempts ended with and the
sequence numbers of their permits (which the ``Window``, ``_window``, hands
out and tracks: which were part of a full window); the window admits
callers under the limit it sets.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

from yieldgate.gate._policy import WindowPolicy

__all__ = ["Limit", "Signal"]

# How much slower the window grows just below the level that last met congestion.
_PLATEAU: Final = 0.25


class Signal(StrEnum):
    """How an attempt ended, as far as the window cares."""

    SUCCESS = "success"
    """The work went well: the window may grow."""
    REFUSED = "refused"
    """A yield, refused before any work was done: the limit sheds exactly one slot."""
    CONGESTION = "congestion"
    """An overload or an attempt timeout: the limit is cut by ``decrease``, once a window."""
    FAILURE = "failure"
    """A failure that says nothing about load: the limit stays."""
    CANCELLED = "cancelled"
    """The attempt was cancelled (a hedge's loser, a caller gone): the limit stays."""


class Limit:
    """The limit of a window (see the module docstring); ``value`` is the limit in force."""

    __slots__ = (
        "_cwnd",
        "_recovery_seq",
        "_ssthresh",
        "_wmax",
        "decreases",
        "increases",
        "policy",
        "value",
    )

    def __init__(self, policy: WindowPolicy) -> None:
        self.policy = policy
        initial = policy.initial
        assert initial is not None  # set by WindowPolicy itself
        self._cwnd = float(initial)
        self._ssthresh = float(policy.max)
        self.value = initial
        self._recovery_seq = 0
        # The limit at which congestion last came (0: never).
        self._wmax = 0
        self.increases = 0
        self.decreases = 0

    @property
    def slow_start(self) -> bool:
        return self._cwnd < self._ssthresh

    def released(self, seq: int, signal: Signal, *, full: bool, latest: int) -> int:
        """The attempt of permit ``seq`` ended with ``signal``: the limit now.

        ``full``: the window was full (its limit bound) at or after that grant;
        ``latest``: the newest permit granted so far (a decrease's event covers
        every permit granted up to it).
        """
        if signal is Signal.SUCCESS:
            if full:
                self._grow()
        elif signal is Signal.REFUSED:
            self._shed(seq, latest)
        elif signal is Signal.CONGESTION and seq > self._recovery_seq:
            self._shrink(latest)
        return self.value

    def _set_cwnd(self, cwnd: float) -> None:
        self._cwnd = cwnd
        self.value = max(self.policy.min, min(self.policy.max, int(cwnd)))

    def _grow(self) -> None:
        if self._cwnd >= self.policy.max:
            return
        if self._cwnd < self._ssthresh:
            cwnd = self._cwnd + 1.0
        else:
            step = self.policy.increase / self._cwnd
            if self.value + 1 == self._wmax:
                step *= _PLATEAU  # the next slot is where congestion came last
            cwnd = self._cwnd + step
        self._set_cwnd(min(cwnd, float(self.policy.max)))
        if self.value >= self._wmax:
            self._wmax = 0  # past it without congestion: the upstream has room again
        self.increases += 1

    def _shed(self, seq: int, latest: int) -> None:
        """One attempt refused: one slot too many."""
        floor = float(self.policy.min)
        if seq > self._recovery_seq:
            # The first refusal of a congestion event: remember where it came.
            self._wmax = self.value
            self._recovery_seq = latest
            self.decreases += 1
        self._set_cwnd(max(floor, min(self._cwnd, float(self.value)) - 1.0))
        if self._cwnd > floor:
            self._ssthresh = self._cwnd
        else:
            # Everything refused: come back by slow start towards where it was.
            self._ssthresh = max(floor, self._wmax * self.policy.decrease)

    def _shrink(self, latest: int) -> None:
        self._wmax = self.value
        self._set_cwnd(max(float(self.policy.min), self._cwnd * self.policy.decrease))
        self._ssthresh = max(float(self.policy.min), self._cwnd)
        # Signals from permits granted up to now belong to this same event.
        self._recovery_seq = latest
        self.decreases += 1
