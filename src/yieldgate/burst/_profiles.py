"""Arrival profiles: when each request of a burst is sent.

A profile turns a request count and a seed into sorted offsets in seconds
from the start of the run. Inter-arrival times follow vLLM's benchmark: gamma
with ``shape = burstiness`` and ``scale = 1 / (rate * burstiness)``, so the
mean rate is ``rate`` whatever the burstiness; burstiness 1 is a Poisson
process, below 1 burstier, above 1 more regular. Ramps are Poisson processes
whose rate changes with time (drawn by time rescaling); a trace replays the
offsets of a JSONL file (``_trace``).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from yieldgate.burst._trace import TraceEntry, load_trace

__all__ = ["ArrivalProfile", "ProfileKind"]

ProfileKind = Literal["all-at-once", "poisson", "gamma", "ramp", "exp-ramp", "trace"]
_KINDS = ("all-at-once", "poisson", "gamma", "ramp", "exp-ramp", "trace")
_RAMPS = ("ramp", "exp-ramp")


def _positive(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ArrivalProfile:
    """How requests arrive. Build one with a class method or ``parse``.

    - ``all_at_once()``: every request at t = 0 (the seed scenarios);
    - ``poisson(rate)``: a Poisson process of ``rate`` requests/s;
    - ``gamma(rate, burstiness)``: gamma inter-arrivals, mean rate ``rate``;
    - ``ramp(start_rate, end_rate, ramp_s)``: a Poisson process whose rate
      rises linearly from ``start_rate`` to ``end_rate`` over ``ramp_s``
      seconds and then stays at ``end_rate``;
    - ``exp_ramp(start_rate, end_rate, ramp_s)``: the same, the rate rising
      geometrically (by the same factor each second);
    - ``trace(path)``: the offsets of a JSONL trace (``load_trace``), as given.
    """

    kind: ProfileKind = "all-at-once"
    rate: float | None = None
    burstiness: float = 1.0
    start_rate: float | None = None
    ramp_s: float | None = None
    trace_path: str | None = None
    entries: tuple[TraceEntry, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"unknown profile kind {self.kind!r}")
        if self.kind not in ("all-at-once", "trace"):
            _positive("rate", self.rate if self.rate is not None else math.nan)
        _positive("burstiness", self.burstiness)
        if self.kind == "trace" and not self.entries:
            raise ValueError("a trace profile needs at least one entry")
        if self.kind in _RAMPS:
            _positive("start_rate", self.start_rate if self.start_rate is not None else math.nan)
            _positive("ramp_s", self.ramp_s if self.ramp_s is not None else math.nan)

    @classmethod
    def all_at_once(cls) -> ArrivalProfile:
        return cls()

    @classmethod
    def poisson(cls, rate: float) -> ArrivalProfile:
        return cls(kind="poisson", rate=rate)

    @classmethod
    def gamma(cls, rate: float, burstiness: float) -> ArrivalProfile:
        return cls(kind="gamma", rate=rate, burstiness=burstiness)

    @classmethod
    def ramp(cls, start_rate: float, end_rate: float, ramp_s: float) -> ArrivalProfile:
        return cls(kind="ramp", start_rate=start_rate, rate=end_rate, ramp_s=ramp_s)

    @classmethod
    def exp_ramp(cls, start_rate: float, end_rate: float, ramp_s: float) -> ArrivalProfile:
        return cls(kind="exp-ramp", start_rate=start_rate, rate=end_rate, ramp_s=ramp_s)

    @classmethod
    def trace(cls, path: str | Path) -> ArrivalProfile:
        """Replay ``path`` (JSONL, ``_trace``); its prompts and ``max_tokens`` go with it."""
        return cls(kind="trace", trace_path=str(path), entries=load_trace(path))

    def with_rate(self, rate: float) -> ArrivalProfile:
        """The same shape at mean rate ``rate`` (a rate sweep's point): all-at-once
        becomes Poisson; ramps and traces have no single rate to change."""
        if self.kind in ("all-at-once", "poisson"):
            return ArrivalProfile.poisson(rate)
        if self.kind == "gamma":
            return ArrivalProfile.gamma(rate, self.burstiness)
        raise ValueError(
            f"a rate sweep needs a poisson or gamma profile (or none), not {self.kind!r}"
        )

    @classmethod
    def parse(cls, text: str) -> ArrivalProfile:
        """``all-at-once`` (or ``burst``), ``poisson:RATE``, ``gamma:RATE:BURSTINESS``,
        ``ramp:START_RATE:END_RATE:SECONDS``, ``exp-ramp:START_RATE:END_RATE:SECONDS``,
        ``trace:PATH``."""
        head, _, rest = text.strip().partition(":")
        if head.lower() == "trace":
            if not rest:
                raise ValueError("profile 'trace' takes a path: trace:PATH")
            return cls.trace(rest)
        name, *args = text.strip().lower().split(":")
        try:
            numbers = [float(a) for a in args]
        except ValueError:
            raise ValueError(f"profile {text!r}: arguments must be numbers") from None
        shapes: dict[str, int] = {
            "all-at-once": 0,
            "burst": 0,
            "poisson": 1,
            "gamma": 2,
            "ramp": 3,
            "exp-ramp": 3,
        }
        if name not in shapes:
            raise ValueError(
                f"unknown profile {name!r}: use all-at-once, poisson:RATE, "
                "gamma:RATE:BURSTINESS, ramp:START:END:SECONDS, exp-ramp:START:END:SECONDS "
                "or trace:PATH"
            )
        if len(numbers) != shapes[name]:
            raise ValueError(f"profile {name!r} takes {shapes[name]} number(s), got {text!r}")
        if name in ("all-at-once", "burst"):
            return cls.all_at_once()
        if name == "poisson":
            return cls.poisson(numbers[0])
        if name == "gamma":
            return cls.gamma(numbers[0], numbers[1])
        if name == "exp-ramp":
            return cls.exp_ramp(numbers[0], numbers[1], numbers[2])
        return cls.ramp(numbers[0], numbers[1], numbers[2])

    def describe(self) -> str:
        """The profile in ``parse``'s syntax."""
        if self.kind == "all-at-once":
            return "all-at-once"
        if self.kind == "poisson":
            return f"poisson:{self.rate:g}"
        if self.kind == "gamma":
            return f"gamma:{self.rate:g}:{self.burstiness:g}"
        if self.kind == "trace":
            return f"trace:{self.trace_path}"
        return f"{self.kind}:{self.start_rate:g}:{self.rate:g}:{self.ramp_s:g}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "spec": self.describe(),
            "rate": self.rate,
            "burstiness": self.burstiness if self.kind == "gamma" else None,
            "start_rate": self.start_rate,
            "ramp_s": self.ramp_s,
            "trace_requests": len(self.entries) if self.kind == "trace" else None,
        }

    def offsets(self, requests: int, *, seed: int = 0) -> list[float]:
        """Arrival offsets in seconds, sorted, the first at 0."""
        if requests < 0:
            raise ValueError("requests must be >= 0")
        if self.kind == "trace" and requests > len(self.entries):
            raise ValueError(
                f"trace {self.trace_path!r} has {len(self.entries)} requests, not {requests}"
            )
        if self.kind == "all-at-once" or requests == 0:
            return [0.0] * requests
        if self.kind == "trace":
            return [e.offset_s for e in self.entries[:requests]]
        rng = random.Random(seed)  # noqa: S311 - a load shape, not secrets
        if self.kind in ("poisson", "gamma"):
            shape = 1.0 if self.kind == "poisson" else self.burstiness
            assert self.rate is not None
            scale = 1.0 / (self.rate * shape)
            times = [0.0]
            for _ in range(requests - 1):
                times.append(times[-1] + rng.gammavariate(shape, scale))
            return times
        # ramps: unit-rate exponential gaps in "expected arrivals" space, mapped
        # back through the inverse of the cumulative rate (time rescaling).
        times = [0.0]
        budget = 0.0
        for _ in range(requests - 1):
            budget += rng.expovariate(1.0)
            times.append(self._inverse_cumulative(budget))
        return times

    def _inverse_cumulative(self, expected: float) -> float:
        assert self.start_rate is not None
        assert self.ramp_s is not None
        assert self.rate is not None
        a, b, s = self.start_rate, self.rate, self.ramp_s
        if self.kind == "exp-ramp" and abs(math.log(b / a)) > 1e-12:
            # rate(t) = a * (b/a)**(t/s): cumulative a*s/ln(b/a) * ((b/a)**(t/s) - 1)
            growth = math.log(b / a)
            in_ramp = a * s * (b / a - 1) / growth
            if expected >= in_ramp:
                return s + (expected - in_ramp) / b
            return s * math.log1p(expected * growth / (a * s)) / growth
        in_ramp = (a + b) / 2 * s  # arrivals expected during the ramp
        if expected >= in_ramp:
            return s + (expected - in_ramp) / b
        slope = (b - a) / s
        if abs(slope) < 1e-12:
            return expected / a
        # a*t + slope*t^2/2 = expected
        return (-a + math.sqrt(a * a + 2 * slope * expected)) / slope
