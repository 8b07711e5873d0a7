"""A fleet's first reading of a quota: one member's request probes, the others wait for it.

A member that has had no answer from an upstream knows nothing of its quota:
alone, it sends its first requests blind (as its window allows) and paces
from the first answer on. Members of a fleet that start together (processes
a deployment starts, no barrier) would each do so, and together send far more
blind than one would. So, before its first admission, a member asks the fleet
(``Fleet.first``):

- the fleet knows the quota (``"known"``): the member paces by its shapes at once;
- nobody probes yet (``"mine"``): one attempt of this member's is the fleet's one
  probe; its other calls wait for its answer;
- another member probes (``"other"``): every call waits, asking again every
  ``WAIT_POLL_S``, until the fleet has the probe's reading;
- the probe's answer carried no quota (``"none"``: a backend that sends no
  rate-limit headers): nothing will teach one; every call goes.

The ask and the probe are held by attempts, entered in their ledgers
(``Attempt.first``) in the step that takes them, and given back by the
ledger whatever ends the attempt (``left``):

- only an answer that came back settles the reading: the probe's member tells
  the fleet every bucket it taught in one operation (``Fleet.probed``: a member
  that paced by some of them only, the requests, say, not the tokens, would
  overrun the others), or, for a success that carried no quota, "none";
- a probe that ends otherwise (never sent, cancelled, a connection error, a
  503 without rate-limit headers) settles nothing: it is handed on at once, to
  a call of this member's that waits for it, or else back to the fleet
  (``Fleet.abandon_first``) for the next member that asks;
- an ask that ends before its answer (cancelled, or a ``FleetConfigError``)
  ends the ask phase at once: the calls waiting on it look again.

The wait is bounded: ``FleetPolicy.first_reading_s`` from the first ask (and
half of what remains of a call's own time). When it runs out before the
fleet's reading came (a Redis or a probing member too slow, a fleet started
on a machine too busy), the member does not send its burst blind: it reads
the quota itself, as it would alone, but with one call (a local probe,
handed on like the fleet's), the others waiting for its answer, for
``first_reading_s`` more; then calls go as they would alone. What its probe
reads teaches the fleet too (``Fleet.probed``). Redis away: no wait (the
member goes on alone, and gives back the probe Redis may have granted it).
Sans-IO, under the Gate's lock; the waiting calls' wake-ups are kept to wake
them when the reading moves.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from yieldgate.gate._cost import DEFAULT_WINDOW_S
from yieldgate.gate._policy import FleetPolicy
from yieldgate.gate._upstream import Upstream

if TYPE_CHECKING:
    from yieldgate.gate._ledger import Attempt

__all__ = ["ASKING", "PROBE", "FirstReadings"]

# How often a waiting call looks again (its member asks the fleet at most this often).
WAIT_POLL_S = 0.05
# How long the probe's answer stands for members that start after it ("no quota", or
# the shapes it taught, whose own keys last as long as their buckets).
PROBED_TTL_S = DEFAULT_WINDOW_S

# What an attempt's ledger holds of a first reading (``Attempt.first``).
ASKING = "asking"
PROBE = "probe"

Op = tuple[str, tuple[Any, ...]]

_ASK, _ASKING, _PROBE, _WAIT, _DONE = range(5)


class _State:
    __slots__ = ("ask_at", "asking", "local", "phase", "probe", "until", "waiting")

    def __init__(self) -> None:
        self.phase = _ASK
        # The fleet's reading did not come in time: this member reads it itself.
        self.local = False
        self.until = math.inf  # when waiting ends, whatever the fleet says
        self.ask_at = -math.inf  # when a waiting member asks the fleet again
        self.asking: Attempt | None = None  # the attempt whose ask is out
        self.probe: Attempt | None = None  # the attempt that is this member's probe
        # The calls parked for the reading: woken when it moves.
        self.waiting: dict[int, Callable[[], None]] = {}


class FirstReadings:
    """Each upstream's first reading, for one member (see the module docstring)."""

    def __init__(self, policy: FleetPolicy) -> None:
        self.wait_s = policy.first_reading_s
        self.poll_s = max(policy.poll_s, WAIT_POLL_S)
        self._states: dict[str, _State] = {}

    def step(
        self, up: Upstream, attempt: Attempt, now: float, deadline: float | None, available: bool
    ) -> tuple[Op | None, float | None]:
        """For ``attempt``, about to be admitted to ``up``: an operation of the fleet's
        to run first (its name and arguments: the ask, entered in the attempt's
        ledger), or a time to wait until; ``(None, None)``: go (as the probe, entered
        in its ledger, while this member holds it)."""
        if self.wait_s <= 0 or not up.quota.learn or up.quota.learnt:
            return None, None
        state = self._states.get(up.name)
        if not available and (state is None or not state.local):
            return None, None  # Redis away from the start: as alone
        if state is None:
            state = self._states[up.name] = _State()
        if state.phase == _DONE:
            return None, None
        if now >= state.until:
            if state.local:
                self._end(state)
                return None, None
            self._go_local(state, now)
        if state.phase == _ASK:
            if state.until == math.inf:
                state.until = now + self.wait_s
            return self._ask(state, up, attempt), None
        if state.phase == _PROBE and state.probe in (None, attempt):
            state.probe = attempt
            attempt.first = PROBE
            return None, None
        if state.phase == _WAIT and now >= state.ask_at:
            return self._ask(state, up, attempt), None
        until = min(state.until, now + self.poll_s)
        if deadline is not None and until > now + (deadline - now) / 2:
            return None, None  # the call cannot afford the wait: it goes as it would alone
        return None, until

    def _go_local(self, state: _State, now: float) -> None:
        """The fleet's reading did not come in time: one call of this member's probes
        (its own probe of the fleet's, if one is out), the others wait for its answer,
        ``wait_s`` more at most. An ask out is still waited for: Redis may make this
        member the fleet's probe."""
        state.local = True
        state.until = now + self.wait_s
        if state.phase in (_ASK, _WAIT):
            state.phase = _PROBE

    def _ask(self, state: _State, up: Upstream, attempt: Attempt) -> Op:
        state.phase = _ASKING
        state.asking = attempt
        attempt.first = ASKING
        return ("first", (up.name, self.wait_s))

    def alone(self, up: Upstream, now: float) -> Op | None:
        """Redis is away while this member waits for the fleet's reading: it reads the
        quota itself (``_go_local``), not with its whole burst blind, and gives back
        the probe Redis made it that no attempt of its took (an operation to run once
        Redis answers)."""
        state = self._states.get(up.name)
        if state is None or state.local or state.phase in (_DONE, _ASKING):
            return None  # an ask out ends with its answer
        held = state.phase == _PROBE and state.probe is None
        self._go_local(state, now)
        self._moved(state)
        return ("abandon_first", (up.name,)) if held else None

    def park(self, up: Upstream, attempt: Attempt, wake: Callable[[], None] | None) -> None:
        """``attempt`` waits for ``up``'s reading (``wake``), or no longer (``None``)."""
        state = self._states.get(up.name)
        if state is None:
            return
        if wake is None:
            state.waiting.pop(id(attempt), None)
        else:
            state.waiting[id(attempt)] = wake

    def _moved(self, state: _State) -> None:
        """The reading moved: every waiting call looks again."""
        for wake in list(state.waiting.values()):
            wake()

    def _end(self, state: _State) -> None:
        state.phase = _DONE
        state.asking = state.probe = None
        self._moved(state)

    def probing(self, upstream: str) -> bool:
        """Whether this member asks for, or probes, ``upstream``'s first reading now."""
        state = self._states.get(upstream)
        return state is not None and state.phase in (_ASKING, _PROBE)

    def settled(self, up: Upstream) -> bool:
        """Whether ``up``'s first reading is over (or off): until then, the fleet's
        shapes come through ``first`` alone, all at once. (Read while a probe's
        answer is being written, bucket by bucket, they could be some of them only:
        a member pacing by the requests bucket alone would overrun the tokens.)"""
        state = self._states.get(up.name)
        return self.wait_s <= 0 or (state is not None and state.phase == _DONE)

    def told(
        self, up: Upstream, attempt: Attempt, got: Any, now: float
    ) -> tuple[dict[str, Any], Op | None]:
        """What ``attempt``'s ask (``Fleet.first``) answered (``None``: Redis away): the
        shapes to seed, and an operation of the fleet's to run (the probe Redis may
        have granted, given back, when its answer never came). Told ``"mine"``, the
        asker is the probe."""
        attempt.first = None
        state = self._states.get(up.name)
        if state is None or state.asking is not attempt:
            return {}, None
        state.asking = None
        if got is None:
            # Redis did not answer: this member goes on alone. Redis may have made it
            # the probe all the same: that is handed back, not left to its TTL.
            self._end(state)
            return {}, ("abandon_first", (up.name,))
        if got.state in ("known", "none"):
            self._end(state)
            return got.shapes, None
        if got.state == "mine":
            # The asker probes: its ledger holds the probe from the answer on.
            state.phase = _PROBE
            state.probe = attempt
            attempt.first = PROBE
        elif state.local:
            state.phase = _PROBE  # past the wait: this member reads the quota itself
        else:
            state.phase = _WAIT
            state.ask_at = now + self.poll_s
        self._moved(state)
        return {}, None

    def left(self, up: Upstream, attempt: Attempt, *, read: bool, answered: bool) -> Op | None:
        """``attempt``, holding ``up``'s ask or probe, is over (its ledger's give-back):
        an operation of the fleet's to run, if any. ``read``: its answer carried quota
        readings; ``answered``: it came back a success."""
        held, attempt.first = attempt.first, None
        state = self._states.get(up.name)
        if state is None:
            return None
        if held == ASKING:
            if state.asking is attempt:
                # The ask ended unanswered: the calls waiting on it look again (the next
                # asks). What Redis granted a cancelled ask goes back with its reply.
                state.asking = None
                state.phase = _PROBE if state.local else _ASK
                self._moved(state)
            return None
        if held != PROBE:
            return None
        mine = state.probe is attempt
        if mine:
            state.probe = None
        shapes = {}
        if read:
            for key, b in up.quota.buckets.items():
                if b.learnt:
                    shapes[key] = (b.resource, b.limit, b.rate)
        if shapes or answered:
            # An answer came back: every bucket it taught, or none (no quota here).
            if state.phase != _DONE:
                self._end(state)
            return ("probed", (up.name, shapes, PROBED_TTL_S))
        # Nothing settled: handed on, to a call of this member's waiting for it, or back
        # to the fleet for the next member that asks (also once this member stopped
        # waiting: Redis may still name it the probe).
        if mine and state.phase == _PROBE:
            if state.waiting:
                self._moved(state)
                return None
            if not state.local:
                state.phase = _ASK
        return ("abandon_first", (up.name,))

    def leaving(self, up: Upstream, attempt: Attempt) -> Op | None:
        """``attempt`` is over (its ledger's give-back, after ``left``): it waits no more,
        and a probe handed on to the calls that waited, none of which took it (they
        ended, or went without waiting for their deadline's sake), goes back to the
        fleet for the next member that asks instead of staying this member's until its
        TTL. An operation of the fleet's to run, if any."""
        state = self._states.get(up.name)
        if state is None:
            return None
        state.waiting.pop(id(attempt), None)
        if state.phase != _PROBE or state.probe is not None or state.waiting:
            return None
        if not state.local:
            state.phase = _ASK
        return ("abandon_first", (up.name,))

    def audit(self) -> list[str]:
        """An ask or a probe held by no live attempt (none when no call runs)."""
        problems = []
        for name, state in self._states.items():
            if state.asking is not None:
                problems.append(f"{name}: the fleet's first reading is being asked for")
            if state.probe is not None:
                problems.append(f"{name}: this member's probe of the first reading is out")
            if state.waiting:
                problems.append(f"{name}: {len(state.waiting)} call(s) wait for the first reading")
        return problems

    def forked(self) -> None:
        """In a forked child: the parent's probe is not this process's."""
        self._states.clear()
