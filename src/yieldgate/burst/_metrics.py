"""Figures nobody else reports: hint accuracy, recovery after a burst, per-priority fairness.

Each is a pure function of what a run recorded, so each is tested on
synthetic logs (docs/burst.md, "Metrics nobody reports", defines them):

- ``hint_accuracy(attempts)``: for every refusal that carried a hint, the time
  from the refusal until the server next admitted an attempt (any client's),
  against the hint;
- ``recovery(probes, last_arrival_s)``: from the last arrival until a quiet
  probe's latency is back to its baseline, measured before the burst;
- ``priority_fairness(requests, priorities)``: success and latency per
  priority class, and Jain's index across the requests of each class.

Times are seconds from the start of the run, as in ``Request``.
"""

from __future__ import annotations

import bisect
import contextlib
import math
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from yieldgate._stats import percentile
from yieldgate.burst._targets import Request
from yieldgate.gate import AttemptDetails

__all__ = [
    "HINT_TOLERANCE_MIN_MS",
    "HINT_TOLERANCE_RATIO",
    "PRIORITY_NAMES",
    "RECOVERY_ABOVE_MS",
    "RECOVERY_FACTOR",
    "RECOVERY_RUN",
    "AttemptLog",
    "AttemptRecord",
    "HintAccuracy",
    "PriorityClass",
    "Probe",
    "Recovery",
    "draw_priorities",
    "hint_accuracy",
    "jain_index",
    "parse_priority_mix",
    "priority_fairness",
    "recovery",
]

#: A hint is accurate when ``|actual - hinted| <= max(25% of the hint, 20 ms)``.
HINT_TOLERANCE_RATIO = 0.25
HINT_TOLERANCE_MIN_MS = 20.0
#: Recovered: ``RECOVERY_RUN`` probes in a row succeed at their first attempt within
#: ``max(RECOVERY_FACTOR x baseline, baseline + RECOVERY_ABOVE_MS)``.
RECOVERY_FACTOR = 2.0
RECOVERY_ABOVE_MS = 20.0
RECOVERY_RUN = 3

_REFUSALS = frozenset({"yield", "overloaded"})


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptRecord:
    """One attempt as the client's Gate saw it end (its instrumentation's ``on_attempt``)."""

    start_s: float
    end_s: float
    outcome: str  # ok, yield, overloaded, retryable, fatal
    hint_s: float | None = None


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


@dataclass(frozen=True, slots=True, kw_only=True)
class HintAccuracy:
    """How well the server's hints foretold when capacity came back.

    ``hints``: refusals (``yield``, ``overloaded``) that carried a hint > 0;
    ``resolved``: those after which an attempt was admitted during the run
    (the others are ``hints - resolved``); ``error_ms_p50`` / ``error_ms_p90``:
    the median and 90th percentile of ``actual - hinted`` (positive: capacity
    came back later than hinted); ``within``: the share of resolved hints
    within ``max(25% of the hint, 20 ms)``; ``hint_ms_p50``: the median hint.
    """

    hints: int = 0
    resolved: int = 0
    error_ms_p50: float | None = None
    error_ms_p90: float | None = None
    within: float | None = None
    hint_ms_p50: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "hints": self.hints,
            "resolved": self.resolved,
            "error_ms_p50": _round(self.error_ms_p50, 1),
            "error_ms_p90": _round(self.error_ms_p90, 1),
            "within": self.within,
            "hint_ms_p50": _round(self.hint_ms_p50, 1),
        }


def hint_accuracy(attempts: Sequence[AttemptRecord]) -> HintAccuracy:
    """Each hinted refusal against the start of the next attempt the server admitted.

    An attempt that ended ``ok`` was admitted when it started (a governed
    server admits or refuses at once), so capacity was back by then: the
    actual wait is from the refusal's end to the first such start at or
    after it, whichever client sent it. That is an upper bound when nobody
    sent anything for a while (a refusal is resolved only by an attempt).
    """
    admitted = sorted(a.start_s for a in attempts if a.outcome == "ok")
    hinted = [
        a
        for a in attempts
        if a.outcome in _REFUSALS and a.hint_s is not None and a.hint_s > 0 and a.hint_s < math.inf
    ]
    errors: list[float] = []
    within = 0
    for refusal in hinted:
        assert refusal.hint_s is not None
        at = bisect.bisect_left(admitted, refusal.end_s)
        if at == len(admitted):
            continue
        actual_ms = (admitted[at] - refusal.end_s) * 1000
        hint_ms = refusal.hint_s * 1000
        error = actual_ms - hint_ms
        errors.append(error)
        if abs(error) <= max(HINT_TOLERANCE_RATIO * hint_ms, HINT_TOLERANCE_MIN_MS):
            within += 1
    return HintAccuracy(
        hints=len(hinted),
        resolved=len(errors),
        error_ms_p50=percentile(errors, 50) if errors else None,
        error_ms_p90=percentile(errors, 90) if errors else None,
        within=within / len(errors) if errors else None,
        hint_ms_p50=percentile([a.hint_s * 1000 for a in hinted if a.hint_s], 50)
        if hinted
        else None,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Probe:
    """One quiet probe: a lone request sent outside the strategy, one at a time.

    ``sent_s`` is negative for the baseline probes sent before the burst.
    ``clean``: it succeeded at its first attempt (no refusal on the way).
    """

    sent_s: float
    end_s: float
    clean: bool

    @property
    def latency_s(self) -> float:
        return self.end_s - self.sent_s


@dataclass(frozen=True, slots=True, kw_only=True)
class Recovery:
    """From the last arrival until the server is back to its baseline: no more
    refusals, and a newcomer served as fast as before the burst.

    ``yields_s``: from the last arrival to the end of the last attempt the
    strategy saw refused (0 when none was refused after it); always known.
    With probes (``--recovery-probe-ms``): ``baseline_ms``, the median latency
    of the clean probes sent before the burst; ``threshold_ms``,
    ``max(2 x baseline, baseline + 20 ms)``; ``latency_s``, from the last
    arrival to the sending of the first of ``RECOVERY_RUN`` probes in a row,
    all sent at or after it, clean and within the threshold (about one probe
    interval when the server never left its baseline; ``None`` when the probes
    stopped first). ``recovery_s``: the later of ``yields_s`` and
    ``latency_s``, ``None`` without probes or when the latency never came back.
    ``probes``: probes sent, baseline included.
    """

    yields_s: float = 0.0
    baseline_ms: float | None = None
    threshold_ms: float | None = None
    latency_s: float | None = None
    recovery_s: float | None = None
    probes: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "yields_s": _round(self.yields_s, 4),
            "baseline_ms": _round(self.baseline_ms, 2),
            "threshold_ms": _round(self.threshold_ms, 2),
            "latency_s": _round(self.latency_s, 4),
            "recovery_s": _round(self.recovery_s, 4),
            "probes": self.probes,
        }


def recovery(
    attempts: Sequence[AttemptRecord],
    last_arrival_s: float,
    probes: Sequence[Probe] | None = None,
) -> Recovery:
    """Apply the recovery rule (``Recovery``) to a run's attempts and probes."""
    refused = [a.end_s for a in attempts if a.outcome in _REFUSALS]
    yields_s = max(0.0, max(refused, default=0.0) - last_arrival_s)
    if not probes:
        return Recovery(yields_s=yields_s)
    baseline = [p.latency_s * 1000 for p in probes if p.sent_s < 0 and p.clean]
    if not baseline:
        return Recovery(yields_s=yields_s, probes=len(probes))
    base = percentile(baseline, 50)
    threshold = max(RECOVERY_FACTOR * base, base + RECOVERY_ABOVE_MS)
    after = sorted((p for p in probes if p.sent_s >= last_arrival_s), key=lambda p: p.sent_s)
    run = 0
    found: float | None = None
    for n, p in enumerate(after):
        run = run + 1 if p.clean and p.latency_s * 1000 <= threshold else 0
        if run == RECOVERY_RUN:
            found = after[n - RECOVERY_RUN + 1].sent_s - last_arrival_s
            break
    return Recovery(
        yields_s=yields_s,
        baseline_ms=base,
        threshold_ms=threshold,
        latency_s=found,
        recovery_s=None if found is None else max(found, yields_s),
        probes=len(probes),
    )


def jain_index(values: Sequence[float]) -> float | None:
    """Jain's fairness index ``(sum x)^2 / (n * sum x^2)``: 1 when all are equal, ``1/n``
    when one gets everything; ``None`` for no values, 1 when all are 0."""
    if not values:
        return None
    square = sum(v * v for v in values)
    if square == 0:
        return 1.0
    return sum(values) ** 2 / (len(values) * square)


@dataclass(frozen=True, slots=True, kw_only=True)
class PriorityClass:
    """The requests of one priority: how many, how many succeeded, their latency,
    and Jain's index of their service rates (``1 / latency`` of a success, 0 of a failure)."""

    priority: str
    requests: int
    succeeded: int
    latency_s_p50: float | None
    latency_s_p99: float | None
    jain: float | None

    @property
    def success_rate(self) -> float:
        return self.succeeded / self.requests if self.requests else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "priority": self.priority,
            "requests": self.requests,
            "succeeded": self.succeeded,
            "success_rate": self.success_rate,
            "latency_s_p50": self.latency_s_p50,
            "latency_s_p99": self.latency_s_p99,
            "jain": self.jain,
        }


_ORDER = {"high": 0, "normal": 1, "low": 2}


def priority_fairness(
    requests: Sequence[Request], priorities: Mapping[int, str]
) -> tuple[PriorityClass, ...]:
    """Per priority class (``high``, ``normal``, ``low``, those present), from each
    request's priority (``priorities[request.index]``, ``normal`` when missing)."""
    classes: dict[str, list[Request]] = {}
    for r in requests:
        classes.setdefault(priorities.get(r.index, "normal"), []).append(r)
    out = []
    for name in sorted(classes, key=lambda n: (_ORDER.get(n, 3), n)):
        members = classes[name]
        latencies = [r.end_s - r.arrival_s for r in members if r.ok and r.end_s is not None]
        rates = [
            1.0 / max(r.end_s - r.arrival_s, 1e-6) if r.ok and r.end_s is not None else 0.0
            for r in members
        ]
        out.append(
            PriorityClass(
                priority=name,
                requests=len(members),
                succeeded=len(latencies),
                latency_s_p50=percentile(latencies, 50) if latencies else None,
                latency_s_p99=percentile(latencies, 99) if latencies else None,
                jain=jain_index(rates),
            )
        )
    return tuple(out)


PRIORITY_NAMES = ("high", "normal", "low")


def parse_priority_mix(text: str) -> tuple[tuple[str, float], ...]:
    """``high=0.2,normal=0.8`` into ``(("high", 0.2), ("normal", 0.8))``: each request's
    priority is drawn from these weights (they need not sum to 1)."""
    out: dict[str, float] = {}
    for part in text.split(","):
        name, eq, weight = part.strip().partition("=")
        name = name.strip().lower()
        if name not in PRIORITY_NAMES:
            raise ValueError(
                f"priority mix {text!r}: unknown priority {name!r}: use high, normal, low"
            )
        try:
            value = float(weight) if eq else 1.0
        except ValueError:
            raise ValueError(f"priority mix {text!r}: {weight!r} is not a number") from None
        if not (value > 0 and math.isfinite(value)):
            raise ValueError(f"priority mix {text!r}: weights must be finite numbers > 0")
        if name in out:
            raise ValueError(f"priority mix {text!r}: {name} given twice")
        out[name] = value
    return tuple(out.items())


def draw_priorities(mix: Sequence[tuple[str, float]], requests: int, seed: int) -> list[str]:
    """Each request's priority, drawn from ``mix`` with ``seed`` (the same burst, the same
    priorities, whatever the strategy)."""
    draws = random.Random(seed ^ 0x5EED)  # noqa: S311 - a workload, not secrets
    names = [name for name, _ in mix]
    weights = [weight for _, weight in mix]
    return draws.choices(names, weights=weights, k=requests)


class AttemptLog:
    """A Gate ``Instrumentation`` that keeps every attempt's end, outcome and hint.

    Times are seconds from ``t0`` (``time.monotonic()``), set when the run begins.
    """

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.records: list[AttemptRecord] = []

    def start_call(self, gate: str, priority: str) -> AttemptLog:
        return self

    def scope(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def on_attempt(self, details: AttemptDetails) -> None:
        end = time.monotonic() - self.t0
        self.records.append(
            AttemptRecord(
                start_s=end - details.duration_s,
                end_s=end,
                outcome=str(details.outcome),
                hint_s=details.hint_s,
            )
        )

    def on_wait(self, details: Any) -> None:
        pass

    def on_end(self, details: Any) -> None:
        pass

    def on_breaker_change(self, details: Any) -> None:
        pass

    def on_window_change(self, details: Any) -> None:
        pass
