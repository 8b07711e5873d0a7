"""Graceful degradation by priority: serve low-priority work worse before refusing it.

Seed 002's two forms, as a sans-IO policy (plain objects fed readings and a
clock; the backend is the driver):

1. **Local prefill while the prefill workers serve high priority.** Remote
   prefill spends the prefill pool's capacity to cut one request's TTFT. When
   at least ``high_busy_jobs`` high-priority prefills are queued at the
   workers, a prompt of a degraded priority is prefilled on the decode worker
   instead (the router's offload rule is ignored for it, reason
   ``yield_to_high``): slower for it, and the workers stay free for high.
2. **A shorter output under sustained overload, before rejection.** The
   *pressure* of a request is the QoS estimator's predicted TTFT over the
   bound early rejection uses (the larger of its priority's objective and its
   own prefill on an idle server), so pressure above 1 is exactly "plain QoS
   would reject it (a prompt alone on an idle server is at most 1, however
   long). Level ``k`` of ``levels`` is **in force** when every pressure
   reading of the last ``sustain_s`` seconds was above
   ``levels[k].pressure``: the readings have stayed above it for
   ``sustain_s`` without a break (one reading at or below it resets that
   level's timer). The deepest level in force applies to the degraded priorities:
   ``max_tokens`` caps the request's output (the reply says so, and its
   ``finish_reason`` is ``length``), ``reject`` refuses it (``yield``,
   reason ``slo``). With no level in force the request is admitted whole,
   even above the objective: a burst shorter than ``sustain_s`` is absorbed,
   not shed.

With early rejection on too (``HarnessConfig.qos``), a degraded priority
short of a rejecting level is also held to ``QosPolicy.check``, on the queue
of the route it will take (the decode worker's alone when
``prefill_locally`` keeps it there): the backend's admission hook does that.

``Degrader`` is not thread-safe: the backend calls ``observe``,
``verdict``, ``cap`` and ``record`` from the event loop (readings come from
admission checks, which run there) and ``prefill_locally`` from the engine
thread, which touches nothing else.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Final

from yieldgate.protocol import Priority

__all__ = ["DegradeConfig", "DegradeLevel", "Degrader", "Verdict"]

_NONE: Final = -1


@dataclass(frozen=True, slots=True, kw_only=True)
class DegradeLevel:
    """One step down: above ``pressure`` (sustained), cap the output at ``max_tokens`` or reject."""

    pressure: float
    max_tokens: int | None = None
    reject: bool = False

    def __post_init__(self) -> None:
        if (
            isinstance(self.pressure, bool)
            or not isinstance(self.pressure, int | float)
            or not (math.isfinite(self.pressure) and self.pressure > 0)
        ):
            raise ValueError(f"pressure must be a finite number > 0, got {self.pressure!r}")
        if self.reject == (self.max_tokens is not None):
            raise ValueError("a level either caps max_tokens or rejects, exactly one of them")
        if self.max_tokens is not None and (
            type(self.max_tokens) is not int or self.max_tokens < 1
        ):
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")


def _default_levels() -> tuple[DegradeLevel, ...]:
    return (DegradeLevel(pressure=1.0, max_tokens=8), DegradeLevel(pressure=2.0, reject=True))


@dataclass(frozen=True, slots=True, kw_only=True)
class DegradeConfig:
    """Who is degraded, when, and how far (see the module docstring).

    ``levels`` go from mild to severe: pressures strictly increasing, caps not
    increasing, and a rejecting level, if any, last.
    """

    priorities: frozenset[Priority] = frozenset({Priority.LOW})
    local_prefill: bool = True
    high_busy_jobs: int = 1
    sustain_s: float = 1.0
    levels: tuple[DegradeLevel, ...] = field(default_factory=_default_levels)

    def __post_init__(self) -> None:
        if not isinstance(self.priorities, frozenset) or not all(
            isinstance(p, Priority) for p in self.priorities
        ):
            raise ValueError("priorities must be a frozenset of Priority")
        if Priority.HIGH in self.priorities:
            raise ValueError("high priority is what degradation protects; it cannot be degraded")
        if type(self.high_busy_jobs) is not int or self.high_busy_jobs < 1:
            raise ValueError(f"high_busy_jobs must be an integer >= 1, got {self.high_busy_jobs!r}")
        if (
            isinstance(self.sustain_s, bool)
            or not isinstance(self.sustain_s, int | float)
            or not (math.isfinite(self.sustain_s) and self.sustain_s >= 0)
        ):
            raise ValueError(f"sustain_s must be a finite number >= 0, got {self.sustain_s!r}")
        if not isinstance(self.levels, tuple) or not all(
            isinstance(level, DegradeLevel) for level in self.levels
        ):
            raise ValueError("levels must be a tuple of DegradeLevel")
        for before, after in zip(self.levels, self.levels[1:], strict=False):
            if after.pressure <= before.pressure:
                raise ValueError("levels' pressures must be strictly increasing")
            if before.reject:
                raise ValueError("a rejecting level must be the last")
            if (
                after.max_tokens is not None
                and before.max_tokens is not None
                and after.max_tokens > before.max_tokens
            ):
                raise ValueError("a deeper level must not allow more tokens")


@dataclass(frozen=True, slots=True)
class Verdict:
    """What happens to one request: admitted (maybe capped) or rejected, and at which level.

    ``level`` is the index into ``DegradeConfig.levels``, ``None`` when none
    applies; ``max_tokens`` is the cap (``None``: as asked).
    """

    reject: bool = False
    max_tokens: int | None = None
    level: int | None = None


_ADMIT: Final = Verdict()


class Degrader:
    """The policy's state: when each level's pressure was last reached without a break."""

    def __init__(self, config: DegradeConfig) -> None:
        self.config = config
        # Per level, when the unbroken run of readings above its pressure began.
        self._since: list[float | None] = [None] * len(config.levels)
        self._last_pressure: float | None = None
        self.applied: Counter[int] = Counter()  # verdicts given, by level
        self.local_prefills = 0

    def observe(self, now: float, pressure: float) -> None:
        """One pressure reading (estimated TTFT over its bound) at time ``now``."""
        if not math.isfinite(pressure) or pressure < 0:
            raise ValueError(f"pressure must be a finite number >= 0, got {pressure!r}")
        self._last_pressure = pressure
        for index, level in enumerate(self.config.levels):
            if pressure <= level.pressure:
                self._since[index] = None
            elif self._since[index] is None:
                self._since[index] = now

    def level(self, now: float) -> int | None:
        """The deepest level in force at ``now``, ``None`` when none is."""
        sustain = self.config.sustain_s
        deepest: int | None = None
        for index, since in enumerate(self._since):
            if since is not None and now - since >= sustain:
                deepest = index
        return deepest

    def verdict(self, priority: Priority, now: float) -> Verdict:
        """What a request of ``priority`` gets now; high priority and unlisted ones: admitted.

        Nothing is counted: ``record`` the verdict that was carried out.
        """
        if priority not in self.config.priorities:
            return _ADMIT
        index = self.level(now)
        if index is None:
            return _ADMIT
        level = self.config.levels[index]
        if level.reject:
            return Verdict(reject=True, level=index)
        return Verdict(max_tokens=level.max_tokens, level=index)

    def cap(self, priority: Priority, now: float) -> Verdict:
        """The deepest *capping* level in force (a request already admitted is not rejected)."""
        if priority not in self.config.priorities:
            return _ADMIT
        sustain = self.config.sustain_s
        found = _ADMIT
        for index, since in enumerate(self._since):
            level = self.config.levels[index]
            if since is not None and now - since >= sustain and not level.reject:
                found = Verdict(max_tokens=level.max_tokens, level=index)
        return found

    def record(self, verdict: Verdict) -> None:
        """Count a verdict that was carried out (a rejection, or an output actually cut)."""
        if verdict.level is not None:
            self.applied[verdict.level] += 1

    def prefill_locally(self, priority: Priority, high_jobs_queued: int) -> bool:
        """Whether this prompt must stay off the prefill workers (they serve high priority)."""
        cfg = self.config
        if not cfg.local_prefill or priority not in cfg.priorities:
            return False
        return high_jobs_queued >= cfg.high_busy_jobs

    def record_local_prefill(self) -> None:
        """Count a prompt the router would have offloaded and kept local for this policy."""
        self.local_prefills += 1

    def stats(self, now: float) -> dict[str, Any]:
        """The level in force, the last pressure, and verdicts by level."""
        level = self.level(now)
        return {
            "level": _NONE if level is None else level,
            "pressure": self._last_pressure,
            "shortened": sum(
                n for i, n in self.applied.items() if not self.config.levels[i].reject
            ),
            "rejected": sum(n for i, n in self.applied.items() if self.config.levels[i].reject),
            "by_level": {str(i): self.applied[i] for i in range(len(self.config.levels))},
            "local_prefills": self.local_prefills,
        }
