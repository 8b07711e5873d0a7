"""A provider's quota, emulated: OpenAI's requests and tokens per minute.

``ProviderQuota`` holds two buckets that refill continuously and hold one
window's limit (``window_s``, a minute unless a rehearsal shortens it):
``rpm`` requests and ``tpm`` tokens, each refilling at ``limit / window_s``
per second. A request costs one request and ``ceil(prompt_chars / 4) +
max_tokens`` tokens (``cost``). It is charged whole at admission when it fits
both buckets, and nothing is refunded after; one that does not fit is refused
and charged nothing, with the time until it fits; one larger than the whole
token bucket is refused for good ("Request too large"). Every decision carries
OpenAI's ``x-ratelimit-*`` headers as of that moment, the resets in Go's
duration format (``6m0s``, ``1.234s``, ``20ms``): the time until the bucket
is full again.

Providers meter per model on one key: with ``per_model`` (or limits named per
model in ``models``) each model has its own two buckets, as OpenAI's do.
``headers="azure"`` answers as Azure OpenAI does: only
``x-ratelimit-remaining-{requests,tokens}`` (no limit, no reset), and on a
429 ``retry-after`` (whole seconds), ``retry-after-ms`` and
``x-ms-retry-after-ms``, with Azure's error body.

Sans-IO: the clock is injected (``time.monotonic`` by default), so tests run
on virtual time. The HTTP front asks it before the Governor (a provider checks
its quota before its servers see the request) and writes the answer.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from yieldgate._headers import (
    RATELIMIT_LIMIT_REQUESTS_HEADER,
    RATELIMIT_LIMIT_TOKENS_HEADER,
    RATELIMIT_REMAINING_REQUESTS_HEADER,
    RATELIMIT_REMAINING_TOKENS_HEADER,
    RATELIMIT_RESET_REQUESTS_HEADER,
    RATELIMIT_RESET_TOKENS_HEADER,
)

__all__ = [
    "ProviderQuota",
    "QuotaConfig",
    "QuotaDecision",
    "QuotaRefusal",
    "QuotaResource",
    "QuotaStatistics",
    "go_duration",
]

QuotaResource = Literal["requests", "tokens"]
QuotaHeaders = Literal["openai", "azure"]
# The models one server keeps buckets for at most (a client naming a new model in
# every request must not grow them without bound): the oldest goes.
MAX_MODELS = 1024

# Where OpenAI's quota messages send the reader (kept: clients match the text).
_LIMITS_URL = "https://platform.openai.com/account/rate-limits"
# Float noise in a refilled level must not refuse a request that fits exactly.
_EPSILON = 1e-6
_LABELS: dict[QuotaResource, str] = {
    "requests": "requests per min (RPM)",
    "tokens": "tokens per min (TPM)",
}


def _milliseconds(seconds: float) -> int:
    """``seconds`` in whole milliseconds, rounded up (never earlier), float noise ignored."""
    return max(0, math.ceil(round(seconds * 1000, 6)))


def go_duration(seconds: float) -> str:
    """``seconds`` as Go prints a duration, to the millisecond (rounded up), as OpenAI sends it.

    >>> [go_duration(s) for s in (0, 0.02, 0.644, 1, 9.816, 65.5, 360, 3600)]
    ['0s', '20ms', '644ms', '1s', '9.816s', '1m5.5s', '6m0s', '1h0m0s']
    """
    ms = _milliseconds(seconds)
    if ms == 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    whole, fraction = divmod(rest, 1000)
    secs = f"{whole}.{fraction:03d}".rstrip("0") if fraction else str(whole)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


@dataclass(frozen=True, slots=True, kw_only=True)
class QuotaConfig:
    """The quota to emulate: ``rpm`` requests and ``tpm`` tokens per ``window_s`` seconds.

    Either limit may be left out (``None``: that resource is not limited and
    its headers are not sent), not both. ``default_max_tokens`` is what a
    request that names no ``max_tokens`` costs for its output (16: the
    legacy completions API's default). ``organization`` appears in the 429
    messages, as OpenAI names the account whose limit was reached.

    ``per_model`` gives each model its own buckets of ``rpm`` and ``tpm``;
    ``models`` names limits of its own for some (``{"gpt-4o": (500, 30000)}``,
    either ``None`` for none) and implies ``per_model``. ``headers`` is the
    header style: ``"openai"`` or ``"azure"`` (what remains, alone).
    """

    rpm: int | None = None
    """Requests per window; ``None``: not limited, and no requests headers."""
    tpm: int | None = None
    """Tokens per window (prompt plus output bound); ``None``: not limited."""
    window_s: float = 60.0
    """The window the limits are for, in seconds (default: 60, a minute)."""
    default_max_tokens: int = 16
    """The output a request naming no ``max_tokens`` is charged (default: 16)."""
    organization: str = "org-yieldgate"
    """The account the 429 messages name, as OpenAI's do."""
    per_model: bool = False
    """Give each model its own buckets of ``rpm`` and ``tpm``."""
    models: Mapping[str, tuple[int | None, int | None]] = field(default_factory=dict, hash=False)
    """Limits of their own for some models, ``{model: (rpm, tpm)}``; implies ``per_model``."""
    headers: QuotaHeaders = "openai"
    """The header style: ``"openai"``, or ``"azure"`` (what remains, alone)."""

    def __post_init__(self) -> None:
        for name in ("rpm", "tpm"):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or value < 1):
                raise ValueError(f"quota {name} must be a positive integer, got {value!r}")
        if self.rpm is None and self.tpm is None and not self.models:
            raise ValueError("a quota needs rpm, tpm or both (or limits per model)")
        if not (self.window_s > 0 and math.isfinite(self.window_s)):
            raise ValueError(f"quota window_s must be a positive number, got {self.window_s!r}")
        if type(self.default_max_tokens) is not int or self.default_max_tokens < 1:
            raise ValueError("quota default_max_tokens must be a positive integer")
        if not self.organization:
            raise ValueError("quota organization must not be empty")
        if self.headers not in ("openai", "azure"):
            raise ValueError(f"quota headers must be 'openai' or 'azure', got {self.headers!r}")
        for model, limits in self.models.items():
            if not isinstance(model, str) or not model:
                raise ValueError(f"a quota's model must be a non-empty string, got {model!r}")
            if not (isinstance(limits, tuple) and len(limits) == 2):
                raise ValueError(f"quota model {model!r}: limits must be (rpm, tpm)")
            for value in limits:
                if value is not None and (type(value) is not int or value < 1):
                    raise ValueError(
                        f"quota model {model!r}: limits must be positive integers or None, "
                        f"got {limits!r}"
                    )
            if limits == (None, None):
                raise ValueError(f"quota model {model!r} needs rpm, tpm or both")

    @property
    def scoped(self) -> bool:
        """Whether each model has buckets of its own."""
        return self.per_model or bool(self.models)

    def limit(self, resource: QuotaResource, model: str = "") -> int | None:
        """The limit of ``resource`` (``"requests"`` or ``"tokens"``) for ``model``."""
        rpm, tpm = self.models.get(model, (self.rpm, self.tpm))
        return rpm if resource == "requests" else tpm


@dataclass(frozen=True, slots=True, kw_only=True)
class QuotaRefusal:
    """Why a request was refused: the provider's 429.

    ``retry_after_s`` is the time until the request's cost fits (both
    buckets), to the millisecond, rounded up; ``None`` for a request larger
    than the whole bucket, which no wait lets through. ``used`` is the limit
    less what remained; ``message`` is OpenAI's text.
    """

    resource: QuotaResource
    limit: int
    used: int
    requested: int
    retry_after_s: float | None
    message: str

    @property
    def too_large(self) -> bool:
        return self.retry_after_s is None


@dataclass(frozen=True, slots=True, kw_only=True)
class QuotaDecision:
    """One request's verdict: charged (``refusal`` is ``None``) or refused.

    ``headers`` are the ``x-ratelimit-*`` headers as of the decision, after
    the charge when there was one.
    """

    cost: int
    headers: tuple[tuple[str, str], ...]
    refusal: QuotaRefusal | None = None

    @property
    def admitted(self) -> bool:
        return self.refusal is None


@dataclass(frozen=True, slots=True, kw_only=True)
class QuotaStatistics:
    """What the quota has done: requests and tokens charged, refusals by resource.

    ``refused_tokens`` counts token-limit refusals that a wait lets through;
    ``too_large`` those that none does.
    """

    requests_charged: int
    """Requests charged against the quota."""
    tokens_charged: int
    """Tokens charged against the quota."""
    refused_requests: int
    """Requests refused with a 429 because the requests bucket was empty."""
    refused_tokens: int
    """Token-limit refusals that a wait lets through."""
    too_large: int
    """Requests refused because they cost more tokens than the whole limit."""

    def as_dict(self) -> dict[str, int]:
        """The counters as ``/stats`` and ``/metrics`` name them."""
        return {
            "quota_requests_charged_total": self.requests_charged,
            "quota_tokens_charged_total": self.tokens_charged,
            "quota_refused_requests_total": self.refused_requests,
            "quota_refused_tokens_total": self.refused_tokens,
            "quota_too_large_total": self.too_large,
        }


class _Bucket:
    """A bucket of ``capacity`` that refills continuously at ``capacity / window_s`` per second."""

    __slots__ = ("_at", "_level", "capacity", "rate")

    def __init__(self, capacity: int, window_s: float, now: float) -> None:
        self.capacity = capacity
        self.rate = capacity / window_s
        self._level = float(capacity)
        self._at = now

    def level(self, now: float) -> float:
        if now > self._at:
            self._level = min(self.capacity, self._level + (now - self._at) * self.rate)
            self._at = now
        return self._level

    def wait_s(self, amount: int, now: float) -> float:
        """How long until ``amount`` fits (0: it fits now)."""
        missing = amount - self.level(now)
        return 0.0 if missing <= _EPSILON else missing / self.rate

    def take(self, amount: int, now: float) -> None:
        self._level = self.level(now) - amount

    def remaining(self, now: float) -> int:
        return max(0, math.floor(self.level(now) + _EPSILON))

    def full_in_s(self, now: float) -> float:
        return (self.capacity - self.level(now)) / self.rate


class ProviderQuota:
    """OpenAI's request and token buckets, for one server (one organization): one pair,
    or one per model (``QuotaConfig.per_model``)."""

    def __init__(self, config: QuotaConfig, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        """The quota it emulates."""
        self._clock = clock
        self._scopes: dict[str, dict[QuotaResource, _Bucket]] = {}
        self._scope("", clock())
        self._requests_charged = 0
        self._tokens_charged = 0
        self._refused: dict[QuotaResource, int] = {"requests": 0, "tokens": 0}
        self._too_large = 0

    def cost(self, prompt: str, max_tokens: int | None) -> int:
        """Tokens a request costs: its prompt (about 4 characters a token) and its output cap."""
        output = self.config.default_max_tokens if max_tokens is None else max_tokens
        return math.ceil(len(prompt) / 4) + output

    def _scope(self, model: str, now: float) -> dict[QuotaResource, _Bucket]:
        """The buckets ``model`` spends (made full when first asked)."""
        scope = model if self.config.scoped else ""
        buckets = self._scopes.get(scope)
        if buckets is None:
            if len(self._scopes) >= MAX_MODELS:
                del self._scopes[next(iter(self._scopes))]
            buckets = {}
            for resource in ("requests", "tokens"):
                limit = self.config.limit(resource, scope)
                if limit is not None:
                    buckets[resource] = _Bucket(limit, self.config.window_s, now)
            self._scopes[scope] = buckets
        return buckets

    def charge(self, cost: int, *, model: str) -> QuotaDecision:
        """Charge one request of ``cost`` tokens for ``model`` if it fits both buckets, now."""
        now = self._clock()
        buckets = self._scope(model, now)
        tokens = buckets.get("tokens")
        if tokens is not None and cost > tokens.capacity:
            self._too_large += 1
            message = (
                f"Request too large for {model} in organization {self.config.organization} on "
                f"{_LABELS['tokens']}: Limit {tokens.capacity}, Requested {cost}. The input or "
                f"output tokens must be reduced in order to run successfully. Visit "
                f"{_LIMITS_URL} to learn more."
            )
            refusal = QuotaRefusal(
                resource="tokens",
                limit=tokens.capacity,
                used=tokens.capacity - tokens.remaining(now),
                requested=cost,
                retry_after_s=None,
                message=message,
            )
            return QuotaDecision(cost=cost, headers=self._headers(buckets, now), refusal=refusal)
        amounts: dict[QuotaResource, int] = {"requests": 1, "tokens": cost}
        waits = {r: bucket.wait_s(amounts[r], now) for r, bucket in buckets.items()}
        # The resource that keeps it out longest names the refusal; its wait lets it in.
        worst = max(waits, key=lambda r: waits[r])
        if waits[worst] > 0:
            self._refused[worst] += 1
            bucket = buckets[worst]
            wait_s = _milliseconds(waits[worst]) / 1000
            message = (
                f"Rate limit reached for {model} in organization {self.config.organization} on "
                f"{_LABELS[worst]}: Limit {bucket.capacity}, Used "
                f"{bucket.capacity - bucket.remaining(now)}, Requested {amounts[worst]}. "
                f"Please try again in {go_duration(wait_s)}. Visit {_LIMITS_URL} to learn more."
            )
            refusal = QuotaRefusal(
                resource=worst,
                limit=bucket.capacity,
                used=bucket.capacity - bucket.remaining(now),
                requested=amounts[worst],
                retry_after_s=wait_s,
                message=message,
            )
            return QuotaDecision(cost=cost, headers=self._headers(buckets, now), refusal=refusal)
        for resource, bucket in buckets.items():
            bucket.take(amounts[resource], now)
        self._requests_charged += 1
        self._tokens_charged += cost
        return QuotaDecision(cost=cost, headers=self._headers(buckets, now))

    def headers(self, model: str = "") -> tuple[tuple[str, str], ...]:
        """The ``x-ratelimit-*`` headers of ``model``'s buckets now, charging nothing."""
        now = self._clock()
        return self._headers(self._scope(model, now), now)

    def _headers(
        self, buckets: dict[QuotaResource, _Bucket], now: float
    ) -> tuple[tuple[str, str], ...]:
        requests, tokens = buckets.get("requests"), buckets.get("tokens")
        headers: list[tuple[str, str]] = []
        if self.config.headers == "azure":  # what remains, alone
            if requests is not None:
                remaining = str(requests.remaining(now))
                headers.append((RATELIMIT_REMAINING_REQUESTS_HEADER, remaining))
            if tokens is not None:
                headers.append((RATELIMIT_REMAINING_TOKENS_HEADER, str(tokens.remaining(now))))
            return tuple(headers)
        if requests is not None:
            headers.append((RATELIMIT_LIMIT_REQUESTS_HEADER, str(requests.capacity)))
        if tokens is not None:
            headers.append((RATELIMIT_LIMIT_TOKENS_HEADER, str(tokens.capacity)))
        if requests is not None:
            headers.append((RATELIMIT_REMAINING_REQUESTS_HEADER, str(requests.remaining(now))))
        if tokens is not None:
            headers.append((RATELIMIT_REMAINING_TOKENS_HEADER, str(tokens.remaining(now))))
        if requests is not None:
            headers.append((RATELIMIT_RESET_REQUESTS_HEADER, go_duration(requests.full_in_s(now))))
        if tokens is not None:
            headers.append((RATELIMIT_RESET_TOKENS_HEADER, go_duration(tokens.full_in_s(now))))
        return tuple(headers)

    def statistics(self) -> QuotaStatistics:
        """What the quota has charged and refused so far."""
        return QuotaStatistics(
            requests_charged=self._requests_charged,
            tokens_charged=self._tokens_charged,
            refused_requests=self._refused["requests"],
            refused_tokens=self._refused["tokens"],
            too_large=self._too_large,
        )
