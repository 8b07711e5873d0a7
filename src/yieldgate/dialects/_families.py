"""Providers' rate-limit header families, as data: a provider is a row, not code.

Each ``Family`` names, for each bucket it describes, the three headers that carry
its limit, what remains of it and when it is full again, what it counts (a
``Cost`` field: ``requests``, ``tokens``, ``input_tokens``, ``output_tokens``),
the window its limit is for when the provider says (a ``-day`` suffix, a documented
daily limit) and how its reset is written. ``FAMILIES`` is read in order and a
header read by one row is not read again by a later one, so that a provider whose
headers are spelt like another's but mean something else (Groq's requests per
*day* under OpenAI's names, told by its ``x-groq-region``) goes before the row it
would be mistaken for. docs/http.md's table cites the source of every row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["FAMILIES", "Bucket", "Family", "ResetFormat"]

MINUTE = 60.0
HOUR = 3600.0
DAY = 86_400.0
MONTH = 30 * DAY

ResetFormat = Literal["duration", "rfc3339", "epoch_or_delta"]
"""``duration``: a Go duration (``6m0s``, ``1.5s``, ``20ms``) or plain seconds;
``rfc3339``: a time (``2026-11-29T10:00:00Z``); ``epoch_or_delta``: a number, read as
epoch milliseconds past 1e12, epoch seconds past 1e9, else seconds from now."""


@dataclass(frozen=True, slots=True)
class Bucket:
    """One bucket's headers: its limit's, its remaining's and its reset's (``None``: not
    sent), what it counts, its window (``None``: not said; a minute is assumed) and
    its name in its family's readings (``None``: what it counts)."""

    limit: str
    remaining: str
    reset: str | None
    resource: str
    window_s: float | None = None
    name: str | None = None


@dataclass(frozen=True, slots=True)
class Family:
    """A provider's rate-limit headers: its buckets, the ``key`` its readings are named
    by (``key:resource``, with a window suffix where one family has several), how its
    resets are written, and a ``marker`` header that must be present for the row to
    apply (``None``: any response)."""

    key: str
    buckets: tuple[Bucket, ...]
    reset: ResetFormat
    marker: str | None = None


def _buckets(
    prefix: str, rows: tuple[tuple[str, str, float | None], ...], *, named: bool = False
) -> tuple[Bucket, ...]:
    """``{prefix}-{limit,remaining,reset}{infix}`` for each ``(infix, resource, window)``;
    ``named``: each reading named by its infix (a family with one resource twice)."""
    return tuple(
        Bucket(
            f"{prefix}-limit{infix}",
            f"{prefix}-remaining{infix}",
            f"{prefix}-reset{infix}",
            resource,
            window,
            infix.lstrip("-") if named else None,
        )
        for infix, resource, window in rows
    )


SECOND = 1.0
_WINDOWS = (
    ("second", SECOND),
    ("10-second", 10 * SECOND),
    ("minute", MINUTE),
    ("5-minute", 5 * MINUTE),
    ("hour", HOUR),
    ("day", DAY),
    ("month", MONTH),
)
# Cerebras spells requests ``requests``, Mistral ``req``.
_SUFFIXED = tuple(
    (f"-{spelt}-{suffix}", what, window)
    for spelt, what in (("requests", "requests"), ("req", "requests"), ("tokens", "tokens"))
    for suffix, window in _WINDOWS
)

FAMILIES: tuple[Family, ...] = (
    # Groq: OpenAI's names, but ``-requests`` is requests per day (RPD); ``-tokens``
    # tokens per minute.
    Family(
        "groq",
        _buckets("x-ratelimit", (("-requests", "requests", DAY), ("-tokens", "tokens", MINUTE))),
        "duration",
        marker="x-groq-region",
    ),
    # OpenAI's organisation limits per model, and its project-level limits beside them.
    Family(
        "openai",
        _buckets("x-ratelimit", (("-requests", "requests", None), ("-tokens", "tokens", None))),
        "duration",
    ),
    Family(
        "openai-project",
        _buckets(
            "x-ratelimit",
            (("-project-requests", "requests", None), ("-project-tokens", "tokens", None)),
        ),
        "duration",
    ),
    # Window-suffixed (Cerebras' ``-requests-day`` / ``-tokens-minute``, Mistral's
    # ``-tokens-minute`` / ``-tokens-month`` / ``-req-minute``): the suffix is the window.
    Family("windowed", _buckets("x-ratelimit", _SUFFIXED, named=True), "duration"),
    # Fireworks: prompt and generated tokens apart, per second (its serverless docs:
    # "effective rate limits (described in tokens per second)"; older docs said per
    # minute). The cache-adjusted prompt's is not read: a cost cannot tell cached tokens.
    Family(
        "fireworks",
        _buckets(
            "x-ratelimit",
            (
                ("-tokens-prompt", "input_tokens", SECOND),
                ("-tokens-generated", "output_tokens", SECOND),
            ),
        ),
        "duration",
    ),
    # Mistral's older limit by request size (tokens), and its minute and month forms.
    Family(
        "mistral",
        (
            Bucket(
                "ratelimitbysize-limit",
                "ratelimitbysize-remaining",
                "ratelimitbysize-reset",
                "tokens",
            ),
            Bucket(
                "x-ratelimitbysize-limit-minute",
                "x-ratelimitbysize-remaining-minute",
                None,
                "tokens",
                MINUTE,
                "tokens-minute",
            ),
            Bucket(
                "x-ratelimitbysize-limit-month",
                "x-ratelimitbysize-remaining-month",
                None,
                "tokens",
                MONTH,
                "tokens-month",
            ),
        ),
        "epoch_or_delta",
    ),
    # Together (told by its ``x-tokenlimit-*``): requests and tokens per second, the
    # requests under the plain triple's names, the reset a delay in seconds.
    Family(
        "together",
        (
            Bucket(
                "x-ratelimit-limit",
                "x-ratelimit-remaining",
                "x-ratelimit-reset",
                "requests",
                SECOND,
            ),
            Bucket("x-tokenlimit-limit", "x-tokenlimit-remaining", None, "tokens", SECOND),
        ),
        "epoch_or_delta",
        marker="x-tokenlimit-limit",
    ),
    # The plain ``X-RateLimit-*`` triple: OpenRouter (its reset in epoch milliseconds),
    # many gateways (epoch seconds, or a delay).
    Family("ratelimit", _buckets("x-ratelimit", (("", "requests", None),)), "epoch_or_delta"),
    # Anthropic: every limit per minute (RPM, ITPM, OTPM). The window, not the reset,
    # gives the rate: a reset is a wall-clock time, off by as much as the clocks disagree.
    Family(
        "anthropic",
        tuple(
            Bucket(
                f"anthropic-ratelimit-{infix}-limit",
                f"anthropic-ratelimit-{infix}-remaining",
                f"anthropic-ratelimit-{infix}-reset",
                resource,
                MINUTE,
            )
            for infix, resource in (
                ("requests", "requests"),
                ("tokens", "tokens"),
                ("input-tokens", "input_tokens"),
                ("output-tokens", "output_tokens"),
            )
        ),
        "rfc3339",
    ),
)
