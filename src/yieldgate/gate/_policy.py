"""The policies: what a Gate is told to do (what it reports is in ``_statistics``).

Every knob is a field of a frozen dataclass, checked when it is built, so a
bad setting fails at start-up with a clear message, never mid-burst. One
``GatePolicy`` gathers them: ``window``, ``retry``, ``budget``, ``breaker``,
``timeout``, ``rate``, ``hedge`` and ``quota``. The mechanisms that follow them live in
their own modules (``_window``, ``_retry``, ``_breaker``, ``_budget``,
``_ratecap``, ``_hedge``); docs/configuration.md lists every field.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

__all__ = [
    "DEFAULT_INITIAL",
    "USE_POLICY",
    "BreakerPolicy",
    "FleetPolicy",
    "GatePolicy",
    "HedgePolicy",
    "QuotaPolicy",
    "RatePolicy",
    "RetryBudgetPolicy",
    "RetryPolicy",
    "TimeoutPolicy",
    "UsePolicy",
    "WindowPolicy",
]


class UsePolicy:
    """The type of ``USE_POLICY``."""

    def __repr__(self) -> str:
        return "USE_POLICY"


USE_POLICY: Final = UsePolicy()
"""``timeout=USE_POLICY`` (the default): the policy's total time; ``None``: no limit."""

# Where slow start begins unless told otherwise (as TCP's initial window grew
# from 1 to 10 segments, and Netflix's concurrency limits begin at 20).
DEFAULT_INITIAL: Final = 8
# Holds cover a priority and those below it: rank 0 is the lowest.


@dataclass(frozen=True, slots=True, kw_only=True)
class WindowPolicy:
    """Bounds and gains of the adaptive window.

    ``initial`` is where slow start begins (default: 8, within ``[min, max]``),
    ``max`` a hard ceiling that nothing passes, ``min`` the floor a decrease
    stops at. ``WindowPolicy.fixed(n)`` is a plain bulkhead of ``n`` slots
    that never adapts.
    """

    initial: int | None = None
    """The limit slow start begins at (default: 8, or ``max`` if lower)."""
    min: int = 1
    """The floor a decrease stops at (default: 1)."""
    max: int = 64
    """The hard ceiling on attempts in flight; nothing passes it (default: 64)."""
    increase: float = 1.0
    """Past slow start, each success adds ``increase / limit`` (default: 1.0)."""
    decrease: float = 0.7
    """An overload or attempt timeout multiplies the limit by this, once a window (default: 0.7)."""

    def __post_init__(self) -> None:
        if self.min < 1:
            raise ValueError(f"window min must be >= 1, got {self.min}")
        if self.max < self.min:
            raise ValueError(f"window max ({self.max}) must be >= min ({self.min})")
        if self.initial is None:
            object.__setattr__(self, "initial", max(self.min, min(DEFAULT_INITIAL, self.max)))
        elif not self.min <= self.initial <= self.max:
            raise ValueError(f"window initial ({self.initial}) must be within [min, max]")
        if not (self.increase >= 0 and math.isfinite(self.increase)):
            raise ValueError("window increase must be a finite number >= 0")
        if not 0.0 < self.decrease <= 1.0:
            raise ValueError("window decrease must be in (0, 1]")

    @classmethod
    def fixed(cls, size: int) -> WindowPolicy:
        """A non-adaptive limit of ``size`` (a bulkhead)."""
        return cls(initial=size, min=size, max=size, increase=0.0, decrease=1.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """How often and how long a call tries again.

    ``max_attempts`` caps attempts that did not end in congestion (a first
    attempt and its retries after failures); ``max_yields`` caps the waits on
    yields and overloads. Both are further bounded by the call's total
    timeout and, for failures and overloads, by the retry budget.

    ``share_hints``: a yield or overload that carries a hint holds back every
    attempt of the Gate at that priority and below until the hint has passed,
    not only the retry of the call that got it. Calls queued behind a cold or
    full upstream then wait once, instead of each collecting a yield of its own.
    """

    max_attempts: int = 4
    """Attempts not ended by congestion, at most (4); past them, ``RetriesExhaustedError``."""
    max_yields: int = 64
    """Waits on yields and overloads, at most (64); past them, ``YieldExhaustedError``."""
    base_s: float = 0.1
    """The first backoff step, in seconds, when there is no hint (default: 0.1)."""
    multiplier: float = 2.0
    """Each backoff step is this times the one before (default: 2.0)."""
    max_backoff_s: float = 10.0
    """The largest backoff step, in seconds (default: 10.0)."""
    hint_jitter: float = 0.5
    """A hint ``h`` becomes a wait drawn from ``[h, h * (1 + hint_jitter)]`` (default: 0.5)."""
    max_hint_s: float = 120.0
    """Hints above this many seconds are clamped to it (default: 120.0)."""
    honour_hints: bool = True
    """Wait on the upstream's hint; ``False``: always back off exponentially."""
    share_hints: bool = True
    """A hint holds back every attempt at that priority and below, not only its call's."""

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        if self.max_yields < 0:
            raise ValueError("max_yields must be >= 0")
        for name in ("base_s", "max_backoff_s", "max_hint_s"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a positive number")
        if not (self.multiplier >= 1 and math.isfinite(self.multiplier)):
            raise ValueError("multiplier must be >= 1")
        if not (self.hint_jitter >= 0 and math.isfinite(self.hint_jitter)):
            raise ValueError("hint_jitter must be a finite number >= 0")

    @classmethod
    def no_retry(cls) -> RetryPolicy:
        """One attempt, no waiting on yields: for callers that retry elsewhere.

        Hints are not shared either: another call's yield must not hold back
        an attempt of a caller that decides about waiting itself.
        """
        return cls(max_attempts=1, max_yields=0, share_hints=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class TimeoutPolicy:
    """Per-attempt and total time limits in seconds (``None``: no limit)."""

    attempt_s: float | None = 60.0
    """One attempt's limit in seconds, past which it is ``retryable`` (default: 60.0)."""
    total_s: float | None = 300.0
    """The whole call's limit in seconds, waits included (300.0); ``DeadlineExceededError``."""

    def __post_init__(self) -> None:
        for name in ("attempt_s", "total_s"):
            value = getattr(self, name)
            if value is not None and not (value > 0 and not math.isnan(value)):
                raise ValueError(f"{name} must be a positive number or None")


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryBudgetPolicy:
    """Retries allowed per request over a sliding window."""

    ratio: float = 0.2
    """Retries allowed per call that sent an attempt, over the window (default: 0.2)."""
    min_per_s: float = 1.0
    """A floor of retries per second, so that a quiet client can still retry (default: 1.0)."""
    window_s: float = 10.0
    """The sliding window, in seconds, kept in ten buckets (default: 10.0)."""

    def __post_init__(self) -> None:
        if not (self.ratio >= 0 and math.isfinite(self.ratio)):
            raise ValueError("budget ratio must be a finite number >= 0")
        if not (self.min_per_s >= 0 and math.isfinite(self.min_per_s)):
            raise ValueError("budget min_per_s must be a finite number >= 0")
        if not (self.window_s > 0 and math.isfinite(self.window_s)):
            raise ValueError("budget window_s must be a positive number")

    @classmethod
    def unlimited(cls) -> RetryBudgetPolicy:
        """No budget: every retry the attempt caps allow is made (the dangerous choice)."""
        return cls(ratio=1e9, min_per_s=1e9)


@dataclass(frozen=True, slots=True, kw_only=True)
class BreakerPolicy:
    """Open after ``fail_max`` consecutive failures; probe after ``reset_timeout_s``.

    ``success_threshold`` probes must succeed, one after another, to close it.
    ``BreakerPolicy.disabled()`` never opens.
    """

    fail_max: int = 5
    """Consecutive failures (attempt timeouts included) that open the breaker (default: 5)."""
    reset_timeout_s: float = 10.0
    """Seconds it stays open before one half-open probe goes through (default: 10.0)."""
    success_threshold: int = 1
    """Successful probes in a row that close it (default: 1)."""
    enabled: bool = True
    """``False``: the breaker never opens."""

    def __post_init__(self) -> None:
        if self.fail_max < 1:
            raise ValueError("breaker fail_max must be >= 1")
        if not (self.reset_timeout_s >= 0 and math.isfinite(self.reset_timeout_s)):
            raise ValueError("breaker reset_timeout_s must be a finite number >= 0")
        if self.success_threshold < 1:
            raise ValueError("breaker success_threshold must be >= 1")

    @classmethod
    def disabled(cls) -> BreakerPolicy:
        """A breaker that never opens: for an upstream whose health is watched elsewhere."""
        return cls(enabled=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class RatePolicy:
    """At most ``per_s`` attempt starts per second, bursting to ``burst``.

    With ``ramp_s > 0`` the cap starts at ``ramp_from_per_s`` and rises
    linearly to ``per_s`` over ``ramp_s`` seconds (slow start for a rate).
    """

    per_s: float
    """At most this many attempt starts per second, retries included (required)."""
    burst: int = 1
    """Starts allowed back to back (default: 1)."""
    ramp_from_per_s: float | None = None
    """The rate a ramp starts from; ``None``: ``min(1, per_s)``."""
    ramp_s: float = 0.0
    """Seconds to ramp linearly up to ``per_s``; 0 (the default): no ramp."""

    def __post_init__(self) -> None:
        if not (self.per_s > 0 and math.isfinite(self.per_s)):
            raise ValueError("rate per_s must be a positive number")
        if self.burst < 1:
            raise ValueError("rate burst must be >= 1")
        if not (self.ramp_s >= 0 and math.isfinite(self.ramp_s)):
            raise ValueError("rate ramp_s must be a finite number >= 0")
        if self.ramp_from_per_s is not None and not 0 < self.ramp_from_per_s <= self.per_s:
            raise ValueError("rate ramp_from_per_s must be in (0, per_s]")


@dataclass(frozen=True, slots=True, kw_only=True)
class QuotaPolicy:
    """A provider's quota: pace attempts so that they fit it, before the 429.

    With ``learn`` (the default) the Gate reads each upstream's quota from
    the rate-limit headers of its responses (OpenAI's and Azure's
    ``x-ratelimit-*``, Anthropic's ``anthropic-ratelimit-*``, the IETF
    ``RateLimit`` fields) and paces by them: nothing to configure.
    ``requests_per_minute`` and ``tokens_per_minute`` set budgets of the
    caller's own, for providers that say nothing (HF endpoints, a
    self-hosted vLLM), or to keep a share of a key; both apply, with the
    headers. They are settled against what an attempt really used (its
    ``usage``); ``settle="estimate"`` keeps the door's estimate (OpenAI's).

    A request's token cost is estimated before it is sent from what the
    transport's dialect reads in its body: the prompt's tokens
    (``count_tokens`` of its text; by default about one per four characters)
    plus its output bound (``max_tokens`` and kin, else
    ``default_output_tokens``), or ``gate.call(..., cost=...)``.

    With ``per_model`` (the default) the learnt quota is kept per model, as
    OpenAI and Anthropic meter it, and per Azure deployment (the request's
    ``model``, or the deployment in its URL): one Gate serves several models,
    none waiting for another's quota (``False``: one quota per upstream). A
    model no answer has described yet is paced by nothing learnt until its
    first answers come; with ``borrow``, by copies of the quota of the model
    read last. The caller's own budgets are the upstream's, spent by every
    model. ``Cost(..., scope="gpt-4o")`` names the scope directly. Names that
    share one quota are one scope: a snapshot an answer names for the model
    requested (its ``model`` field) is learnt, ``aliases`` names the rest.
    """

    learn: bool = True
    """Read each upstream's quota from its rate-limit headers and pace by it (default)."""
    requests_per_minute: float | None = None
    """A request budget of the caller's own, per upstream; ``None``: none."""
    tokens_per_minute: float | None = None
    """A token budget of the caller's own, per upstream; ``None``: none."""
    default_output_tokens: int = 256
    """The output charged to a request that sets no ``max_tokens`` (256)."""
    count_tokens: Callable[[str], int] | None = None
    """``count_tokens(text) -> int`` for prompts; ``None``: one token per 4 characters."""
    per_model: bool = True
    """Keep the learnt quota per model and Azure deployment; ``False``: per upstream."""
    borrow: bool = False
    """Pace a model not yet described by a copy of the quota of the model read last."""
    settle: Literal["usage", "estimate"] = "usage"
    """What the caller's budgets are charged: each response's ``usage``, or the ``"estimate"``."""
    aliases: Mapping[str, str] | tuple[tuple[str, str], ...] = ()
    """Model names metered as another's quota: ``{"my-deployment-b": "gpt-4o"}`` (kept
    as sorted pairs). A snapshot an answer names for a requested model
    (``gpt-4o-2024-08-06`` for ``gpt-4o``) is learnt as one without it."""

    def __post_init__(self) -> None:
        aliases = dict(self.aliases)
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in aliases.items()):
            raise TypeError("quota aliases must map model names (str) to scopes (str)")
        object.__setattr__(self, "aliases", tuple(sorted(aliases.items())))
        for name in ("requests_per_minute", "tokens_per_minute"):
            value = getattr(self, name)
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise ValueError(f"quota {name} must be a positive number or None")
        if self.default_output_tokens < 0:
            raise ValueError("quota default_output_tokens must be >= 0")
        if self.count_tokens is not None and not callable(self.count_tokens):
            raise TypeError("quota count_tokens must be a callable taking a str")
        if self.settle not in ("usage", "estimate"):
            raise ValueError(f"quota settle must be 'usage' or 'estimate', got {self.settle!r}")

    @property
    def active(self) -> bool:
        """Whether the Gate paces by a quota at all."""
        return (
            self.learn
            or self.requests_per_minute is not None
            or (self.tokens_per_minute is not None)
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetPolicy:
    """How a Gate that shares its state (``Gate(shared=...)``) uses Redis.

    Shared, per upstream: the quota's buckets (the fleet paces as one), hint
    holds (a yield or 429 seen by one member holds every member's attempts at
    that priority and below) and, with ``inflight_cap``, a fleet-wide cap on
    attempts in flight, as leases that expire ``lease_ttl_s`` after they were
    taken (a member killed holding them loses them; keep it above your
    longest attempt). Each Redis operation is bounded by ``budget_s``; when
    Redis is down or slow, the Gate goes on alone, pacing the quota at
    ``1 / members`` of what the provider's headers say, and rejoins when
    Redis answers again. ``prefix`` starts every key (one per application).

    A fleet paces from its first call: a member with no answer yet asks the
    fleet for the quota; when nobody knows it yet, one member's first request
    probes it and every other call of the fleet waits for its reading, at
    most ``first_reading_s`` (0: no wait; each member sends its first
    requests blind, as alone). Until Redis first answers a member, its
    operations may take up to ``first_reading_s`` too, not just ``budget_s``: a
    member that never reached the fleet does not know how many share the quota,
    and a slow first answer would leave it pacing the whole quota as its own.

    A Redis that refuses the fleet's credentials or commands (a wrong
    password, an ACL user without ``EVALSHA``) is a configuration error, not an
    outage: calls raise ``FleetConfigError``. With ``fail_open`` they go on
    alone instead, as during an outage, a warning is logged again as the
    back-off grows, and ``Fleet.statistics().config_error`` says why the fleet
    is not shared.
    """

    inflight_cap: int | None = None
    """A fleet-wide cap on attempts in flight per upstream; ``None``: no cap."""
    budget_s: float = 0.25
    """The longest a Redis operation may take, in seconds (0.05); past it the Gate goes on alone."""
    lease_ttl_s: float = 60.0
    """Seconds a lease (or membership) lives unrenewed; above your longest attempt."""
    prefix: str = "yieldgate"
    """The first part of every Redis key, one per application (default: ``"yieldgate"``)."""
    poll_s: float = 0.02
    """Mean pause, in seconds, before asking again for an in-flight slot (default: 0.02)."""
    first_reading_s: float = 5.0
    """How long calls wait for one member's probe of the quota (default: 5.0)."""
    fail_open: bool = False
    """On refused credentials or commands, go on alone instead of raising ``FleetConfigError``."""

    def __post_init__(self) -> None:
        if self.inflight_cap is not None and self.inflight_cap < 1:
            raise ValueError("fleet inflight_cap must be >= 1 or None")
        for name in ("budget_s", "lease_ttl_s", "poll_s"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"fleet {name} must be a positive number")
        if not (self.first_reading_s >= 0 and math.isfinite(self.first_reading_s)):
            raise ValueError("fleet first_reading_s must be a finite number >= 0")
        if not self.prefix or any(c in self.prefix for c in "{}"):
            raise ValueError("fleet prefix must be a non-empty string without braces")


@dataclass(frozen=True, slots=True, kw_only=True)
class HedgePolicy:
    """When a Gate starts extra attempts for a call that has not answered yet.

    ``max_hedges`` extra attempts at most per round of attempts (one round per
    retry). The delay before each is ``delay_s`` when given; otherwise the
    ``quantile`` of the last ``samples`` successful attempt latencies (the time
    to the value, or to the first chunk of a stream), once ``min_samples``
    have been seen, and ``initial_delay_s`` until then; never less than
    ``min_delay_s``.
    """

    max_hedges: int = 1
    """Extra attempts at most per round of attempts (default: 1)."""
    delay_s: float | None = None
    """A fixed delay before each hedge, in seconds; ``None``: by ``quantile``."""
    quantile: float = 0.95
    """The delay's quantile of recent successful latencies (default: 0.95)."""
    initial_delay_s: float = 1.0
    """The delay, in seconds, until ``min_samples`` have been seen (default: 1.0)."""
    min_delay_s: float = 0.01
    """The least delay, in seconds, whatever the quantile says (default: 0.01)."""
    min_samples: int = 20
    """Latencies needed before the quantile is used (default: 20)."""
    samples: int = 200
    """How many recent latencies are kept (default: 200)."""

    def __post_init__(self) -> None:
        if self.max_hedges < 1:
            raise ValueError("max_hedges must be >= 1")
        for name in ("initial_delay_s", "min_delay_s"):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number >= 0")
        if self.delay_s is not None and not (self.delay_s >= 0 and math.isfinite(self.delay_s)):
            raise ValueError("delay_s must be a finite number >= 0 or None")
        if not 0 < self.quantile < 1:
            raise ValueError("quantile must be between 0 and 1 (exclusive)")
        if self.min_samples < 1:
            raise ValueError("min_samples must be >= 1")
        if self.samples < self.min_samples:
            raise ValueError("samples must be >= min_samples")

    @classmethod
    def fixed(cls, delay_s: float, *, max_hedges: int = 1) -> HedgePolicy:
        """Hedge after a fixed ``delay_s``."""
        return cls(delay_s=delay_s, max_hedges=max_hedges)


@dataclass(frozen=True, slots=True, kw_only=True)
class GatePolicy:
    """Everything a Gate does, in one frozen record. The defaults are safe:
    slow start from 8 up to 64 in flight, 4 attempts, a 20% retry budget, a
    breaker after 5 consecutive failures, 60 s per attempt and 300 s in all,
    no rate cap, no hedging, and pacing by the quota each upstream's
    rate-limit headers announce. With several upstreams, ``window``,
    ``breaker`` and ``quota`` apply to each of them.
    """

    window: WindowPolicy = field(default_factory=WindowPolicy)
    """The adaptive concurrency window."""
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    """Attempt caps and the waits between attempts."""
    budget: RetryBudgetPolicy = field(default_factory=RetryBudgetPolicy)
    """Retries as a share of recent calls, for the whole Gate."""
    breaker: BreakerPolicy = field(default_factory=BreakerPolicy)
    """The circuit breaker."""
    timeout: TimeoutPolicy = field(default_factory=TimeoutPolicy)
    """The attempt timeout and the call's total time."""
    rate: RatePolicy | None = None
    """A cap on attempt starts per second; ``None`` (the default): no cap."""
    hedge: HedgePolicy | None = None
    """Extra attempts for a call slow to answer; ``None`` (the default): no hedging."""
    quota: QuotaPolicy = field(default_factory=QuotaPolicy)
    """Pacing by a provider's request and token quota, learnt from its headers."""
    fleet: FleetPolicy = field(default_factory=FleetPolicy)
    """How a Gate built with ``shared=`` uses Redis."""

    @classmethod
    def cold_start(cls, *, max_concurrency: int = 16, per_s: float | None = None) -> GatePolicy:
        """For a backend that may be loading: one in flight at first, a patient retry
        policy, and (given ``per_s``) a rate that ramps up over 30 s."""
        rate = None
        if per_s is not None:
            rate = RatePolicy(per_s=per_s, ramp_from_per_s=min(1.0, per_s), ramp_s=30.0)
        return cls(
            window=WindowPolicy(initial=1, max=max_concurrency),
            retry=RetryPolicy(max_attempts=5, max_yields=200),
            timeout=TimeoutPolicy(attempt_s=120.0, total_s=600.0),
            rate=rate,
        )

    @classmethod
    def interactive(cls) -> GatePolicy:
        """A person is waiting: tight timeouts, few retries, fail fast."""
        return cls(
            retry=RetryPolicy(max_attempts=3, max_yields=16, max_backoff_s=2.0),
            timeout=TimeoutPolicy(attempt_s=30.0, total_s=45.0),
        )

    @classmethod
    def batch(cls) -> GatePolicy:
        """Throughput over latency: ride out long overloads, patiently."""
        return cls(
            retry=RetryPolicy(max_attempts=6, max_yields=1000, max_backoff_s=30.0),
            timeout=TimeoutPolicy(attempt_s=300.0, total_s=3600.0),
        )
