"""A fleet's first reading of a quota: one member's request probes, the others wait for it.

A member that has had no answer from an upstream knows nothing of its quota:
alone, it sends its first requests blind (as its window allows) and paces
from the first answer on. Members of a fleet that start together (processes
a deployment starts, no barrier) would each do so, and together send far more
blind than one would. So, before its first admission, a member asks the fleet
(``Fleet.first``):

- the fleet knows the quota (``"known"``): the member paces by its shapes at once;
- nobody probes yet (``"mine"``): this member's first call is the fleet's one
  probe; its other calls wait for its answer;
- another member probes (``"other"``): every call waits, asking again every
  ``WAIT_POLL_S``, until the fleet has the probe's reading;
- the probe's answer carried no quota (``"none"``: a backend that sends no
  rate-limit headers): nothing will teach one; every call goes.

The probe's member tells the fleet what its answer taught in one operation
(``Fleet.probed``): every bucket at once, since a member that paced by some
of them only (the requests, say, not the tokens) would overrun the others.

The wait is bounded: ``FleetPolicy.first_reading_s`` from the first ask (and
half of what remains of a call's own time), after which calls go as they
would alone; a probe answered without a reading ends every wait at once. Redis
away: no wait (the member goes on alone). Sans-IO, under the Gate's lock.
"""

from __future__ import annotations

import math
from typing import Any

from yieldgate.gate._cost import DEFAULT_WINDOW_S
from yieldgate.gate._policy import FleetPolicy
from yieldgate.gate._upstream import Upstream

__all__ = ["FirstReadings"]

# How often a waiting call looks again (its member asks the fleet at most this often).
WAIT_POLL_S = 0.05
# How long the probe's answer stands for members that start after it ("no quota", or
# the shapes it taught, whose own keys last as long as their buckets).
PROBED_TTL_S = DEFAULT_WINDOW_S

_ASK, _ASKING, _PROBE, _WAIT, _DONE = range(5)


class _State:
    __slots__ = ("ask_at", "phase", "probe", "until")

    def __init__(self) -> None:
        self.phase = _ASK
        self.until = math.inf  # when waiting ends, whatever the fleet says
        self.ask_at = -math.inf  # when a waiting member asks the fleet again
        self.probe: object | None = None  # the call that is this member's probe


class FirstReadings:
    """Each upstream's first reading, for one member (see the module docstring)."""

    def __init__(self, policy: FleetPolicy) -> None:
        self.wait_s = policy.first_reading_s
        self.poll_s = max(policy.poll_s, WAIT_POLL_S)
        self._states: dict[str, _State] = {}

    def step(
        self, up: Upstream, call: object, now: float, deadline: float | None, available: bool
    ) -> tuple[tuple[str, tuple[Any, ...]] | None, float | None]:
        """For ``call``, about to be admitted to ``up``: an operation of the fleet's to
        run first (its name and arguments), or a time to wait until; ``(None, None)``: go."""
        if self.wait_s <= 0 or not available or not up.quota.learn or up.quota.learnt:
            return None, None
        state = self._states.get(up.name)
        if state is None:
            state = self._states[up.name] = _State()
        if state.phase == _DONE:
            return None, None
        if state.phase == _ASK:
            state.phase = _ASKING
            state.until = now + self.wait_s
            return ("first", (up.name, self.wait_s)), None
        if now >= state.until:
            state.phase = _DONE
            return None, None
        if state.phase == _PROBE and state.probe in (None, call):
            state.probe = call
            return None, None
        if state.phase == _WAIT and now >= state.ask_at:
            state.phase = _ASKING
            return ("first", (up.name, self.wait_s)), None
        until = min(state.until, now + self.poll_s)
        if deadline is not None and until > now + (deadline - now) / 2:
            return None, None  # the call cannot afford the wait: it goes as it would alone
        return None, until

    def settled(self, up: Upstream) -> bool:
        """Whether ``up``'s first reading is over (or off): until then, the fleet's
        shapes come through ``first`` alone, all at once. (Read while a probe's
        answer is being written, bucket by bucket, they could be some of them only:
        a member pacing by the requests bucket alone would overrun the tokens.)"""
        state = self._states.get(up.name)
        return self.wait_s <= 0 or (state is not None and state.phase == _DONE)

    def told(self, up: Upstream, got: Any, now: float) -> dict[str, Any]:
        """What ``Fleet.first`` answered (``None``: Redis away): the shapes to seed."""
        state = self._states.get(up.name)
        if state is None or state.phase != _ASKING:
            return {}
        if got is None or got.state in ("known", "none"):
            state.phase = _DONE
            return {} if got is None else got.shapes
        if got.state == "mine":
            state.phase = _PROBE
        else:
            state.phase = _WAIT
            state.ask_at = now + self.poll_s
        return {}

    def answered(self, up: Upstream) -> tuple[str, tuple[Any, ...]] | None:
        """An attempt of this member's to ``up`` ended, sent: if it was the probe, the
        fleet's operation that tells the others what it taught (``Fleet.probed``):
        every bucket learnt at once, or none (they stop waiting)."""
        state = self._states.get(up.name)
        if state is None or state.phase != _PROBE or state.probe is None:
            return None
        state.phase = _DONE
        shapes = {
            key: (b.resource, b.limit, b.rate) for key, b in up.quota.buckets.items() if b.learnt
        }
        return ("probed", (up.name, shapes, PROBED_TTL_S))

    def forked(self) -> None:
        """In a forked child: the parent's probe is not this process's."""
        self._states.clear()
