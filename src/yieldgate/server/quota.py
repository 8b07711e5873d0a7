"""A provider's quota, emulated: OpenAI's requests and tokens per minute, and Anthropic's.

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

The Messages route meters as Anthropic does (``charge_messages``), in
buckets of its own (another provider's): ``rpm`` requests, ``itpm`` input
tokens and ``otpm`` output tokens, and ``tpm`` as a combined tokens bucket
where it is set. The output is charged ``max_tokens`` at the door, and what
the answer did not use is given back when it ends (``settle_messages``), as
Anthropic adjusts it; the headers are Anthropic's (``_quota_anthropic``).

Sans-IO: the clock is injected (``time.monotonic`` by default), so tests run
on virtual time. The HTTP front asks it before the Governor (a provider checks
its quota before its servers see the request) and writes the answer.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from yieldgate._headers import (
    RATELIMIT_LIMIT_REQUESTS_HEADER,
    RATELIMIT_LIMIT_TOKENS_HEADER,
    RATELIMIT_REMAINING_REQUESTS_HEADER,
    RATELIMIT_REMAINING_TOKENS_HEADER,
    RATELIMIT_RESET_REQUESTS_HEADER,
    RATELIMIT_RESET_TOKENS_HEADER,
)
from yieldgate.server._quota_anthropic import anthropic_headers, too_large_message, wait_message
from yieldgate.server._quota_config import QuotaConfig, QuotaResource

__all__ = [
    "ProviderQuota",
    "QuotaConfig",
    "QuotaDecision",
    "QuotaRefusal",
    "QuotaResource",
    "QuotaStatistics",
    "go_duration",
]

# Whose quota a route spends: OpenAI's (every route but one) or Anthropic's (the Messages route).
QuotaFamily = Literal["openai", "anthropic"]
_RESOURCES: dict[QuotaFamily, tuple[QuotaResource, ...]] = {
    "openai": ("requests", "tokens"),
    "anthropic": ("requests", "tokens", "input_tokens", "output_tokens"),
}
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
    refused_input_tokens: int = 0
    """Messages-route refusals by the input tokens limit that a wait lets through."""
    refused_output_tokens: int = 0
    """Messages-route refusals by the output tokens limit that a wait lets through."""
    output_tokens_given_back: int = 0
    """Output tokens charged at the door and given back: what answers did not use."""

    def as_dict(self) -> dict[str, int]:
        """The counters as ``/stats`` and ``/metrics`` name them."""
        return {
            "quota_requests_charged_total": self.requests_charged,
            "quota_tokens_charged_total": self.tokens_charged,
            "quota_refused_requests_total": self.refused_requests,
            "quota_refused_tokens_total": self.refused_tokens,
            "quota_too_large_total": self.too_large,
            "quota_refused_input_tokens_total": self.refused_input_tokens,
            "quota_refused_output_tokens_total": self.refused_output_tokens,
            "quota_output_tokens_given_back_total": self.output_tokens_given_back,
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

    def give(self, amount: int, now: float) -> None:
        self._level = min(self.capacity, self.level(now) + amount)

    def remaining(self, now: float) -> int:
        return max(0, math.floor(self.level(now) + _EPSILON))

    def full_in_s(self, now: float) -> float:
        return (self.capacity - self.level(now)) / self.rate


class ProviderQuota:
    """OpenAI's request and token buckets, for one server (one organization): one pair,
    or one per model (``QuotaConfig.per_model``); and the Messages route's own, as
    Anthropic keeps them (``charge_messages``).

    ``clock`` times the buckets; ``wall_clock`` (seconds since the epoch) dates
    Anthropic's resets.
    """

    def __init__(
        self,
        config: QuotaConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        """The quota it emulates."""
        self._clock = clock
        self._wall_clock = wall_clock
        self._scopes: dict[tuple[QuotaFamily, str], dict[QuotaResource, _Bucket]] = {}
        self._scope("", clock())
        self._requests_charged = 0
        self._tokens_charged = 0
        self._refused: dict[QuotaResource, int] = dict.fromkeys(_RESOURCES["anthropic"], 0)
        self._too_large = 0
        self._given_back = 0

    def prompt_tokens(self, prompt: str) -> int:
        """Tokens a prompt costs: about 4 characters a token, rounded up."""
        return math.ceil(len(prompt) / 4)

    def cost(self, prompt: str, max_tokens: int | None) -> int:
        """Tokens a request costs: its prompt (about 4 characters a token) and its output cap."""
        output = self.config.default_max_tokens if max_tokens is None else max_tokens
        return self.prompt_tokens(prompt) + output

    def _scope(
        self, model: str, now: float, family: QuotaFamily = "openai"
    ) -> dict[QuotaResource, _Bucket]:
        """The buckets ``model`` spends on ``family``'s routes (made full when first asked)."""
        scope = model if self.config.scoped else ""
        buckets = self._scopes.get((family, scope))
        if buckets is None:
            if len(self._scopes) >= MAX_MODELS:
                del self._scopes[next(iter(self._scopes))]
            buckets = {}
            for resource in _RESOURCES[family]:
                limit = self.config.limit(resource, scope)
                if limit is not None:
                    buckets[resource] = _Bucket(limit, self.config.window_s, now)
            self._scopes[(family, scope)] = buckets
        return buckets

    def charge(self, cost: int, *, model: str) -> QuotaDecision:
        """Charge one request of ``cost`` tokens for ``model`` if it fits both buckets, now."""
        return self._charge("openai", {"requests": 1, "tokens": cost}, model)

    def charge_messages(
        self, input_tokens: int, output_tokens: int, *, model: str
    ) -> QuotaDecision:
        """Charge one request to the Messages route's buckets for ``model`` if it fits them
        all, now: ``input_tokens`` of input and ``output_tokens`` (its ``max_tokens``) of output,
        until ``settle_messages`` gives back what the answer did not use."""
        amounts: dict[QuotaResource, int] = {
            "requests": 1,
            "tokens": input_tokens + output_tokens,
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
        }
        return self._charge("anthropic", amounts, model)

    def settle_messages(self, charged: int, used: int, *, model: str) -> None:
        """Give back to ``model``'s output tokens bucket what a Messages request charged
        (``charged``) and its answer did not use (``used``)."""
        now = self._clock()
        bucket = self._scope(model, now, "anthropic").get("output_tokens")
        unused = max(0, charged - used)
        if bucket is not None and unused:
            bucket.give(unused, now)
            self._given_back += unused

    def _charge(
        self, family: QuotaFamily, amounts: dict[QuotaResource, int], model: str
    ) -> QuotaDecision:
        now = self._clock()
        buckets = self._scope(model, now, family)
        cost = amounts["tokens"]
        for resource, bucket in buckets.items():
            if resource != "requests" and amounts[resource] > bucket.capacity:
                return self._too_large_refusal(family, buckets, resource, amounts, model, now)
        waits = {r: bucket.wait_s(amounts[r], now) for r, bucket in buckets.items()}
        # The resource that keeps it out longest names the refusal; its wait lets it in.
        worst = max(waits, key=lambda r: waits[r], default=None)
        if worst is not None and waits[worst] > 0:
            self._refused[worst] += 1
            bucket = buckets[worst]
            wait_s = _milliseconds(waits[worst]) / 1000
            used = bucket.capacity - bucket.remaining(now)
            if family == "anthropic":
                message = wait_message(model, worst, bucket.capacity, used, amounts[worst], wait_s)
            else:
                message = (
                    f"Rate limit reached for {model} in organization {self.config.organization} "
                    f"on {_LABELS[worst]}: Limit {bucket.capacity}, Used {used}, Requested "
                    f"{amounts[worst]}. Please try again in {go_duration(wait_s)}. Visit "
                    f"{_LIMITS_URL} to learn more."
                )
            refusal = QuotaRefusal(
                resource=worst,
                limit=bucket.capacity,
                used=used,
                requested=amounts[worst],
                retry_after_s=wait_s,
                message=message,
            )
            return QuotaDecision(
                cost=cost, headers=self._headers(family, buckets, now), refusal=refusal
            )
        for resource, bucket in buckets.items():
            bucket.take(amounts[resource], now)
        self._requests_charged += 1
        self._tokens_charged += cost
        return QuotaDecision(cost=cost, headers=self._headers(family, buckets, now))

    def _too_large_refusal(
        self,
        family: QuotaFamily,
        buckets: dict[QuotaResource, _Bucket],
        resource: QuotaResource,
        amounts: dict[QuotaResource, int],
        model: str,
        now: float,
    ) -> QuotaDecision:
        """The refusal of a request larger than the whole ``resource`` bucket: for good."""
        self._too_large += 1
        bucket = buckets[resource]
        requested = amounts[resource]
        if family == "anthropic":
            message = too_large_message(model, resource, bucket.capacity, requested)
        else:
            message = (
                f"Request too large for {model} in organization {self.config.organization} on "
                f"{_LABELS[resource]}: Limit {bucket.capacity}, Requested {requested}. The input "
                f"or output tokens must be reduced in order to run successfully. Visit "
                f"{_LIMITS_URL} to learn more."
            )
        refusal = QuotaRefusal(
            resource=resource,
            limit=bucket.capacity,
            used=bucket.capacity - bucket.remaining(now),
            requested=requested,
            retry_after_s=None,
            message=message,
        )
        headers = self._headers(family, buckets, now)
        return QuotaDecision(cost=amounts["tokens"], headers=headers, refusal=refusal)

    def headers(
        self, model: str = "", *, family: QuotaFamily = "openai"
    ) -> tuple[tuple[str, str], ...]:
        """The rate-limit headers of ``model``'s buckets on ``family``'s routes now
        (``x-ratelimit-*``, or Anthropic's), charging nothing."""
        now = self._clock()
        return self._headers(family, self._scope(model, now, family), now)

    def _headers(
        self, family: QuotaFamily, buckets: dict[QuotaResource, _Bucket], now: float
    ) -> tuple[tuple[str, str], ...]:
        if family == "anthropic":
            return anthropic_headers(buckets, now, self._wall_clock())
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
            refused_input_tokens=self._refused["input_tokens"],
            refused_output_tokens=self._refused["output_tokens"],
            output_tokens_given_back=self._given_back,
        )
