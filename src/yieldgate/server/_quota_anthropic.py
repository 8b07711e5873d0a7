"""Anthropic's side of the emulated quota: its rate-limit headers and its 429 messages.

Anthropic meters requests, input tokens and output tokens per minute in
buckets of their own, and describes each in ``anthropic-ratelimit-{requests,
input-tokens, output-tokens}-{limit, remaining, reset}``, the reset the
moment the bucket is full again as an RFC 3339 time (here in UTC, to the
millisecond, rounded up). ``anthropic-ratelimit-tokens-*`` describes a
combined tokens bucket where one is set (``QuotaConfig.tpm``), else both
token buckets together (their limits and what remains of them added, the
later reset), as Anthropic's own answers show them; with one of the two
alone it is not sent. What remains is not rounded to the thousand as
Anthropic rounds it: a rehearsal's small limits would read as nothing left.

The buckets are ``ProviderQuota``'s (``yieldgate.server.quota``), read
here through what ``BucketView`` names.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

__all__ = [
    "ANTHROPIC_RESOURCES",
    "BucketView",
    "anthropic_headers",
    "rfc3339",
    "too_large_message",
    "wait_message",
]

# The buckets of the Messages route, in the order Anthropic lists their headers.
ANTHROPIC_RESOURCES = ("requests", "tokens", "input_tokens", "output_tokens")
_LABELS = {
    "requests": "requests per minute",
    "tokens": "tokens per minute",
    "input_tokens": "input tokens per minute",
    "output_tokens": "output tokens per minute",
}


class BucketView(Protocol):
    """What the headers read of a bucket."""

    @property
    def capacity(self) -> int: ...

    def remaining(self, now: float) -> int: ...

    def full_in_s(self, now: float) -> float: ...


def rfc3339(timestamp: float) -> str:
    """``timestamp`` (seconds since the epoch) as an RFC 3339 time in UTC, to the
    millisecond, rounded up (never earlier than it).

    >>> rfc3339(1_750_000_000.0001)
    '2025-06-15T15:06:40.001Z'
    """
    ms = math.ceil(round(timestamp * 1000, 6))
    whole, fraction = divmod(ms, 1000)
    return datetime.fromtimestamp(whole, UTC).strftime("%Y-%m-%dT%H:%M:%S") + f".{fraction:03d}Z"


def anthropic_headers(
    buckets: Mapping[Any, BucketView], now: float, wall_now: float
) -> tuple[tuple[str, str], ...]:
    """The ``anthropic-ratelimit-*`` headers of ``buckets`` (by resource name) at ``now``
    (their clock), the resets as wall times (``wall_now`` is the wall clock at ``now``)."""
    rows: list[tuple[str, int, int, float]] = []  # resource, limit, remaining, seconds to full
    for resource in ANTHROPIC_RESOURCES:
        bucket = buckets.get(resource)
        if bucket is not None:
            rows.append((resource, bucket.capacity, bucket.remaining(now), bucket.full_in_s(now)))
        elif resource == "tokens":
            parts = [buckets.get("input_tokens"), buckets.get("output_tokens")]
            if all(part is not None for part in parts):
                rows.append(
                    (
                        "tokens",
                        sum(p.capacity for p in parts if p is not None),
                        sum(p.remaining(now) for p in parts if p is not None),
                        max(p.full_in_s(now) for p in parts if p is not None),
                    )
                )
    headers: list[tuple[str, str]] = []
    for resource, limit, remaining, full_in_s in rows:
        name = f"anthropic-ratelimit-{resource.replace('_', '-')}"
        headers.append((f"{name}-limit", str(limit)))
        headers.append((f"{name}-remaining", str(remaining)))
        headers.append((f"{name}-reset", rfc3339(wall_now + max(0.0, full_in_s))))
    return tuple(headers)


def wait_message(
    model: str, resource: str, limit: int, used: int, requested: int, wait_s: float
) -> str:
    """A 429's message: which limit holds the request back, and for how long."""
    return (
        f"Rate limit reached for {model} on {_LABELS[resource]}: limit {limit}, used {used}, "
        f"requested {requested}. Try again in {wait_s:g} s (retry-after); the "
        f"anthropic-ratelimit-* headers show what remains."
    )


def too_large_message(model: str, resource: str, limit: int, requested: int) -> str:
    """The message of a request larger than the whole bucket: no wait lets it through."""
    return (
        f"Request too large for {model} on {_LABELS[resource]}: limit {limit}, requested "
        f"{requested}. No wait lets it through: reduce the prompt or max_tokens."
    )
