"""Reading retry hints and retry advice out of HTTP headers.

The headers, in the order a hint is looked for (openai-python's order):

- ``retry-after-ms``: milliseconds, a decimal number (Azure also sends it as
  ``x-ms-retry-after-ms``).
- ``retry-after``: seconds (a decimal number, as RFC 9110 allows only an
  integer but servers send fractions), or an HTTP date.
- ``x-should-retry``: ``true`` or ``false``, the server's verdict on whether a
  retry can succeed, which overrides what the status alone would say.

A header that cannot be read gives no hint rather than an error: a bad hint
must never turn a retryable answer into a crash. Every number read goes
through the Gate's one sanitiser (``sanitize_hint_s``): negative or not finite
is no hint, huge is clamped.

Some providers put the wait only in the error message: OpenAI's token-limit
429 ends ``Please try again in 1.234s`` (a Go duration: ``20ms``, ``6m0s``),
Azure OpenAI's ``Please retry after 6 seconds``. ``message_hint_s`` reads
those, for a reply whose headers carry no hint.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Mapping
from datetime import UTC
from email.utils import parsedate_to_datetime

from yieldgate._headers import (
    MS_RETRY_AFTER_MS_HEADER,
    RETRY_AFTER_HEADER,
    RETRY_AFTER_MS_HEADER,
    SHOULD_RETRY_HEADER,
)
from yieldgate.gate._outcome import sanitize_hint_s

__all__ = ["message_hint_s", "retry_hint_s", "should_retry"]


def _number(text: str) -> float | None:
    try:
        value = float(text.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _date_delay_s(text: str, now: Callable[[], float]) -> float | None:
    try:
        when = parsedate_to_datetime(text.strip())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # an HTTP date is always GMT
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - now())


def retry_hint_s(
    headers: Mapping[str, str], *, now: Callable[[], float] = time.time
) -> float | None:
    """The server's retry hint in seconds, from ``retry-after-ms`` (or Azure's
    ``x-ms-retry-after-ms``) or ``retry-after``.

    ``headers`` must look names up case-insensitively (httpx's ``Headers``
    does). An HTTP date in the past gives 0. ``now`` is the wall clock the
    date is measured against.
    """
    for name in (RETRY_AFTER_MS_HEADER, MS_RETRY_AFTER_MS_HEADER):
        millis = headers.get(name)
        if millis is not None:
            hint = sanitize_hint_s(_number(millis), unit_s=0.001)
            if hint is not None:
                return hint
    after = headers.get(RETRY_AFTER_HEADER)
    if after is None:
        return None
    number = _number(after)
    if number is not None:
        return sanitize_hint_s(number)
    return sanitize_hint_s(_date_delay_s(after, now))


_DURATION = r"(?:\d+(?:\.\d+)?(?:ms|h|m|s))+"
_MESSAGE_HINT = re.compile(
    rf"(?:try again in|retry after)\s+(?:({_DURATION})\b|(\d+(?:\.\d+)?)\s*seconds?\b)",
    re.IGNORECASE,
)
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def message_hint_s(message: str) -> float | None:
    """The wait an error ``message`` asks for ("try again in 1.5s", "retry after 6 seconds")."""
    match = _MESSAGE_HINT.search(message)
    if match is None:
        return None
    duration, seconds = match.groups()
    if seconds is not None:
        return sanitize_hint_s(_number(seconds))
    total = sum(float(n) * _UNIT_S[unit] for n, unit in _DURATION_PART.findall(duration))
    return sanitize_hint_s(total)


def should_retry(headers: Mapping[str, str]) -> bool | None:
    """``x-should-retry`` as a verdict: ``True``, ``False`` or ``None`` (absent or unreadable)."""
    value = headers.get(SHOULD_RETRY_HEADER)
    if value is None:
        return None
    value = value.strip().lower()
    if value == "true":
        return True
    if value == "false":
        return False
    return None
