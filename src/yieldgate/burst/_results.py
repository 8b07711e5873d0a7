"""What a run measured: per-strategy results, their summary figures, the report.

Every figure is computed from what the client saw (``Request`` records and
its Gate's statistics); the server's counters, when it has a ``stats`` op or
``GET /stats``, are kept beside them so the two can be checked against each
other.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from yieldgate._stats import percentile
from yieldgate.burst._metrics import (
    AttemptRecord,
    HintAccuracy,
    PriorityClass,
    Probe,
    Recovery,
    hint_accuracy,
    priority_fairness,
    recovery,
)
from yieldgate.burst._rates import makespan_lower_bound, per_window, rate_window_s
from yieldgate.burst._targets import Request

__all__ = [
    "SCHEMA_ID",
    "SWEEP_SCHEMA_ID",
    "BurstReport",
    "Goal",
    "Percentiles",
    "ServerCounters",
    "Slo",
    "StrategyResult",
    "TimelinePoint",
    "makespan_lower_bound",
    "summarise",
]

SCHEMA_ID = "yieldgate.burst/1"
"""The ``schema`` field of a burst report's JSON, naming its format and version."""
SWEEP_SCHEMA_ID = "yieldgate.burst-sweep/1"
"""The ``schema`` field of a sweep report's JSON."""
_COUNTERS = ("admitted", "executed", "failed", "cancelled", "yielded", "errors")


@dataclass(frozen=True, slots=True, kw_only=True)
class Percentiles:
    """Nearest-rank percentiles (``yieldgate._stats``) of a sample; all ``None`` when empty."""

    count: int = 0
    p50: float | None = None
    p95: float | None = None
    p99: float | None = None
    mean: float | None = None

    @classmethod
    def of(cls, values: Sequence[float], scale: float = 1.0) -> Percentiles:
        if not values:
            return cls()
        scaled = [v * scale for v in values]
        return cls(
            count=len(scaled),
            p50=percentile(scaled, 50),
            p95=percentile(scaled, 95),
            p99=percentile(scaled, 99),
            mean=sum(scaled) / len(scaled),
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "p50": self.p50,
            "p95": self.p95,
            "p99": self.p99,
            "mean": self.mean,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Slo:
    """Service-level objectives for goodput; ``None`` means no objective."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_ms", "tpot_ms", "e2e_ms"):
            value = getattr(self, name)
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise ValueError(f"slo {name} must be a finite number > 0")

    def as_dict(self) -> dict[str, Any]:
        return {"ttft_ms": self.ttft_ms, "tpot_ms": self.tpot_ms, "e2e_ms": self.e2e_ms}


@dataclass(frozen=True, slots=True, kw_only=True)
class Goal:
    """What a scenario expects of the ``yieldgate`` strategy."""

    min_success_rate: float = 1.0
    max_attempts_per_request: float | None = None
    max_makespan_ratio: float | None = None

    def verdict(self, result: StrategyResult) -> tuple[bool, str]:
        parts = [f"success {result.success_rate:.1%} (goal >= {self.min_success_rate:.0%})"]
        met = result.success_rate >= self.min_success_rate
        if self.max_attempts_per_request is not None:
            parts.append(
                f"{result.attempts_per_request:.2f} attempts/request "
                f"(goal <= {self.max_attempts_per_request:g})"
            )
            met = met and result.attempts_per_request <= self.max_attempts_per_request
        if self.max_makespan_ratio is not None:
            ratio = result.makespan_ratio
            shown = "n/a" if ratio is None else f"{ratio:.2f}x"
            parts.append(f"makespan {shown} the lower bound (goal <= {self.max_makespan_ratio:g})")
            met = met and ratio is not None and ratio <= self.max_makespan_ratio
        return met, ", ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        return {
            "min_success_rate": self.min_success_rate,
            "max_attempts_per_request": self.max_attempts_per_request,
            "max_makespan_ratio": self.max_makespan_ratio,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class TimelinePoint:
    """One sample, taken every ``sample_interval_s`` while a strategy runs."""

    t_s: float
    client_inflight: int
    client_attempts: int
    client_yields: int
    completed: int
    failed: int
    server_inflight: int | None = None
    server_executed: int | None = None
    server_yielded: int | None = None
    # From the scraped Prometheus endpoint (--scrape), mapped to common series
    # (yieldgate.burst._scrape); None when not scraped or the server has no such metric.
    scraped_queue: float | None = None
    scraped_running: float | None = None
    scraped_kv_cache: float | None = None
    # Resident memory of the server process (and its children), when the tool started it.
    server_rss_bytes: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "t_s": round(self.t_s, 4),
            "client_inflight": self.client_inflight,
            "client_attempts": self.client_attempts,
            "client_yields": self.client_yields,
            "completed": self.completed,
            "failed": self.failed,
            "server_inflight": self.server_inflight,
            "server_executed": self.server_executed,
            "server_yielded": self.server_yielded,
            "scraped_queue": self.scraped_queue,
            "scraped_running": self.scraped_running,
            "scraped_kv_cache": self.scraped_kv_cache,
            "server_rss_bytes": self.server_rss_bytes,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerCounters:
    """The server's counters around one strategy's run (its ``stats`` op)."""

    max_inflight: int
    exec_ms_ewma: float | None
    inflight_peak: int
    # The mean of the executions measured during the run (None from a server that
    # reports no exec_ms_total): the bound's execution time.
    exec_ms_mean: float | None = None
    delta: Mapping[str, int]
    yielded_by_reason: Mapping[str, int]
    serving: Mapping[str, Any] | None = None

    @classmethod
    def between(cls, before: Mapping[str, Any], after: Mapping[str, Any]) -> ServerCounters:
        delta = {k: int(after[f"{k}_total"]) - int(before[f"{k}_total"]) for k in _COUNTERS}
        reasons_before = before.get("yielded_by_reason", {})
        reasons = {
            reason: int(n) - int(reasons_before.get(reason, 0))
            for reason, n in after.get("yielded_by_reason", {}).items()
        }
        backend = after.get("backend")
        serving = backend.get("serving") if isinstance(backend, Mapping) else None
        ewma = after.get("exec_ms_ewma")
        mean = None
        measured = delta["executed"] + delta["failed"]
        if measured > 0 and "exec_ms_total" in after and "exec_ms_total" in before:
            mean = (float(after["exec_ms_total"]) - float(before["exec_ms_total"])) / measured
        return cls(
            max_inflight=int(after["max_inflight"]),
            exec_ms_ewma=None if ewma is None else float(ewma),
            exec_ms_mean=mean,
            inflight_peak=int(after.get("inflight_peak", 0)),
            delta=delta,
            yielded_by_reason={k: v for k, v in reasons.items() if v},
            serving=serving,
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "max_inflight": self.max_inflight,
            "exec_ms_ewma": self.exec_ms_ewma,
            "exec_ms_mean": self.exec_ms_mean,
            "inflight_peak": self.inflight_peak,
            "delta": dict(self.delta),
            "yielded_by_reason": dict(self.yielded_by_reason),
            "serving": None if self.serving is None else dict(self.serving),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class StrategyResult:
    """One strategy's run, summarised. ``as_dict`` is its JSON form (docs/burst.md)."""

    strategy: str
    label: str
    requests: int
    succeeded: int
    attempts: int
    yields: int
    errors_by_kind: Mapping[str, int]
    makespan_s: float
    lower_bound_s: float | None
    latency_s: Percentiles
    streaming: Mapping[str, Percentiles] | None
    goodput_good: int
    slo: Slo
    server: ServerCounters | None
    timeline: tuple[TimelinePoint, ...] = field(default=())
    # Chunks the successes streamed (a chunk is a token); None when not streaming.
    output_tokens: int | None = None
    # docs/burst.md, "Metrics nobody reports" (yieldgate.burst._metrics).
    hint_accuracy: HintAccuracy | None = None
    recovery: Recovery | None = None
    priorities: tuple[PriorityClass, ...] = ()
    # The most resident memory sampled of a server the tool started (None otherwise).
    server_rss_peak_bytes: int | None = None
    unreachable: str | None = None  # "connection refused to HOST:PORT": why, if any could not
    # The offered window: the last arrival, from the first (0 when all arrive at once).
    offered_s: float = 0.0
    # False: the run was cut short (a signal, a dead server) before every request ended.
    complete: bool = True

    @property
    def timeouts(self) -> int:
        """Requests the client gave up on at its time-out (``--timeout-s``)."""
        return self.errors_by_kind.get("timeout", 0)

    @property
    def failed(self) -> int:
        return self.requests - self.succeeded

    @property
    def success_rate(self) -> float:
        return self.succeeded / self.requests if self.requests else 0.0

    @property
    def attempts_per_request(self) -> float:
        return self.attempts / self.requests if self.requests else 0.0

    @property
    def makespan_ratio(self) -> float | None:
        if self.lower_bound_s is None or self.lower_bound_s <= 0:
            return None
        return self.makespan_s / self.lower_bound_s

    @property
    def goodput_ratio(self) -> float:
        return self.goodput_good / self.requests if self.requests else 0.0

    @property
    def window_s(self) -> float:
        """What the rates are per second of: the offered window, the makespan or the lower
        bound, the longest (``yieldgate.burst._rates``), so failing fast never looks fast."""
        return rate_window_s(self.offered_s, self.makespan_s, self.lower_bound_s)

    @property
    def goodput_per_s(self) -> float:
        return per_window(self.goodput_good, self.window_s)

    @property
    def throughput_per_s(self) -> float:
        """Successes per second of the window (``window_s``)."""
        return per_window(self.succeeded, self.window_s)

    @property
    def tokens_per_s(self) -> float | None:
        """Streamed output tokens per second of the window; ``None`` when not streaming."""
        return None if self.output_tokens is None else per_window(self.output_tokens, self.window_s)

    def as_dict(self, *, timeline: bool = True) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            "label": self.label,
            "requests": self.requests,
            "succeeded": self.succeeded,
            "failed": self.failed,
            "success_rate": self.success_rate,
            "attempts": self.attempts,
            "attempts_per_request": self.attempts_per_request,
            "yields": self.yields,
            "errors_by_kind": dict(sorted(self.errors_by_kind.items())),
            "makespan_s": self.makespan_s,
            "lower_bound_s": self.lower_bound_s,
            "makespan_ratio": self.makespan_ratio,
            "offered_s": self.offered_s,
            "window_s": self.window_s,
            "latency_s": self.latency_s.as_dict(),
            "streaming": None
            if self.streaming is None
            else {k: v.as_dict() for k, v in self.streaming.items()},
            "throughput_per_s": self.throughput_per_s,
            "output_tokens": self.output_tokens,
            "tokens_per_s": self.tokens_per_s,
            "goodput": {
                "slo": self.slo.as_dict(),
                "good": self.goodput_good,
                "ratio": self.goodput_ratio,
                "per_s": self.goodput_per_s,
            },
            "server": None if self.server is None else self.server.as_dict(),
            "timeouts": self.timeouts,
            "hint_accuracy": None if self.hint_accuracy is None else self.hint_accuracy.as_dict(),
            "recovery": None if self.recovery is None else self.recovery.as_dict(),
            "priorities": [c.as_dict() for c in self.priorities],
            "server_rss_peak_bytes": self.server_rss_peak_bytes,
            "unreachable": self.unreachable,
            "complete": self.complete,
            "timeline": [p.as_dict() for p in self.timeline] if timeline else [],
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class BurstReport:
    """A whole run: its configuration, the machine, one result per strategy."""

    config: Mapping[str, Any]
    machine: Mapping[str, Any]
    created: str
    results: tuple[StrategyResult, ...]
    goal: Goal | None = None
    # Why the run was cut short (``yieldgate.burst._stop``), and the strategies it never
    # finished: those without a result, by label.
    stopped_by: str | None = None
    unfinished: tuple[str, ...] = ()

    @property
    def interrupted(self) -> bool:
        return self.stopped_by is not None

    def verdicts(self) -> list[tuple[str, bool, str]]:
        """``(label, met, text)`` for each ``yieldgate`` result, when the run has a goal."""
        if self.goal is None:
            return []
        out = []
        for result in self.results:
            if result.strategy == "yieldgate":
                met, text = self.goal.verdict(result)
                out.append((result.label, met, text))
        return out

    def as_dict(self, *, timeline: bool = True) -> dict[str, Any]:
        return {
            "schema": SCHEMA_ID,
            "created": self.created,
            "config": dict(self.config),
            "machine": dict(self.machine),
            "goal": None if self.goal is None else self.goal.as_dict(),
            "interrupted": self.interrupted,
            "stopped_by": self.stopped_by,
            "unfinished": list(self.unfinished),
            "results": [r.as_dict(timeline=timeline) for r in self.results],
        }


def summarise(
    *,
    strategy: str,
    label: str,
    requests: Sequence[Request],
    attempts: int,
    yields: int,
    slo: Slo,
    stream: bool,
    server: ServerCounters | None,
    timeline: Sequence[TimelinePoint],
    cold_start_s: float = 0.0,
    ramp_s: float = 0.0,
    attempt_log: Sequence[AttemptRecord] | None = None,
    probes: Sequence[Probe] | None = None,
    priorities: Mapping[int, str] | None = None,
    complete: bool = True,
) -> StrategyResult:
    """Turn the raw records of one run into its figures.

    ``attempt_log`` (every attempt the Gate saw end) gives the hint accuracy
    and the recovery of yields, ``probes`` the recovery of latency,
    ``priorities`` (request index to class) the per-priority figures; each
    is left out (``None``, empty) when not given.
    """
    ends = [r.end_s for r in requests if r.end_s is not None]
    makespan = max(ends) if ends else 0.0
    oks = [r for r in requests if r.ok]
    latencies = [r.end_s - r.arrival_s for r in oks if r.end_s is not None]
    errors: dict[str, int] = {}
    for r in requests:
        if not r.ok:
            kind = r.error or "unfinished"
            errors[kind] = errors.get(kind, 0) + 1

    streaming: dict[str, Percentiles] | None = None
    ttft: dict[int, float] = {}
    tpot: dict[int, float] = {}
    if stream:
        itl: list[float] = []
        for r in oks:
            if not r.chunk_s or r.end_s is None:
                continue
            ttft[r.index] = r.chunk_s[0] - r.arrival_s
            if len(r.chunk_s) > 1:
                tpot[r.index] = (r.chunk_s[-1] - r.chunk_s[0]) / (len(r.chunk_s) - 1)
                itl.extend(b - a for a, b in zip(r.chunk_s, r.chunk_s[1:], strict=False))
        streaming = {
            "ttft_ms": Percentiles.of(list(ttft.values()), 1000.0),
            "tpot_ms": Percentiles.of(list(tpot.values()), 1000.0),
            "itl_ms": Percentiles.of(itl, 1000.0),
        }

    def good(r: Request) -> bool:
        assert r.end_s is not None
        if slo.e2e_ms is not None and (r.end_s - r.arrival_s) * 1000 > slo.e2e_ms:
            return False
        if stream and slo.ttft_ms is not None and ttft.get(r.index, math.inf) * 1000 > slo.ttft_ms:
            return False
        return not (
            stream and slo.tpot_ms is not None and tpot.get(r.index, 0.0) * 1000 > slo.tpot_ms
        )

    bound, last_arrival = None, max((r.arrival_s for r in requests), default=0.0)
    # The run's mean execution time; the moving average leans to the last few
    # executions (on a batching backend, the fast ones at the end of a burst).
    exec_ms = None if server is None else server.exec_ms_mean or server.exec_ms_ewma
    if server is not None and exec_ms is not None:
        bound = makespan_lower_bound(
            len(requests),
            exec_ms / 1000,
            server.max_inflight,
            cold_start_s=cold_start_s,
            ramp_s=ramp_s,
            last_arrival_s=last_arrival,
        )
    return StrategyResult(
        strategy=strategy,
        label=label,
        requests=len(requests),
        succeeded=len(oks),
        attempts=attempts,
        yields=yields,
        errors_by_kind=errors,
        makespan_s=makespan,
        lower_bound_s=bound,
        latency_s=Percentiles.of(latencies),
        streaming=streaming,
        goodput_good=sum(1 for r in oks if good(r)),
        slo=slo,
        server=server,
        timeline=tuple(timeline),
        output_tokens=sum(len(r.chunk_s) for r in oks) if stream else None,
        hint_accuracy=None if attempt_log is None else hint_accuracy(attempt_log),
        recovery=None if attempt_log is None else recovery(attempt_log, last_arrival, probes),
        priorities=() if not priorities else priority_fairness(requests, priorities),
        server_rss_peak_bytes=max(
            (p.server_rss_bytes for p in timeline if p.server_rss_bytes is not None),
            default=None,
        ),
        unreachable=next((r.unreachable for r in requests if r.unreachable), None),
        offered_s=last_arrival,
        complete=complete,
    )
