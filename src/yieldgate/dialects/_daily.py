"""A 429 for a daily (or monthly) quota: not a minute's wait.

Providers say it two ways. Their header families name the window (Groq's
requests per day, Cerebras' and Mistral's ``-day`` and ``-month`` headers): a
429 whose headers show such a bucket spent is one. Or the body says so:
OpenRouter's "Rate limit exceeded: free-models-per-day", Groq's "on requests per
day (RPD)", Gemini's OpenAI-compatible endpoint's ``quotaId``
``GenerateRequestsPerDayPerProjectPerModel-FreeTier``. OpenRouter also relays the
refusing bucket's headers inside the body (``error.metadata.headers``): read as
the response's own. Anthropic's unified limits (a subscription's five-hour and
seven-day windows) say ``anthropic-ratelimit-unified-status: rejected`` and the
epoch second they refill at (``anthropic-ratelimit-unified-reset``).

The rule answers ``yield``, reason ``daily_quota``, with the time until the quota
refills as its hint (the hint headers, the message's "try again in", else the
spent bucket's reset), so that a call whose deadline it fits waits for it (Groq's
daily requests refill continuously) and one it does not fits fails at once with
``QuotaExhaustedError`` naming the reset; with no reset said at all, ``fatal``
(reason ``daily_quota``): no wait within a call is known to help.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from typing import Any

from yieldgate.dialects._families import DAY
from yieldgate.dialects._gemini import spent_quota
from yieldgate.dialects._hints import message_hint_s
from yieldgate.dialects._ratelimit import quota_readings, reset_s
from yieldgate.dialects._reply import Reply
from yieldgate.gate import Outcome

__all__ = ["daily_refusal"]

# "per day", "free-models-per-day", "PerDay", "daily", "_daily", "(RPD)", "limit_rpd/",
# "tokens per day (TPD)", and the same of months.
_SAID = re.compile(
    r"per[\s_-]?(?:day|month)|(?<![a-z])(?:daily|monthly|rpd|tpd)(?![a-z])", re.IGNORECASE
)
_MAX_SCANNED = 8192  # characters of a 429's body searched for the words


class _Folded(dict[str, str]):
    """Header names looked up case-insensitively (a body's relayed headers)."""

    def get(self, key: str, default: Any = None) -> Any:
        return super().get(key.lower(), default)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and super().__contains__(key.lower())


def _relayed(body: Any) -> Mapping[str, str] | None:
    """OpenRouter's ``error.metadata.headers``: the refusing bucket's headers."""
    error = body.get("error") if isinstance(body, dict) else None
    metadata = error.get("metadata") if isinstance(error, dict) else None
    headers = metadata.get("headers") if isinstance(metadata, dict) else None
    if not isinstance(headers, dict):
        return None
    return _Folded({str(k).lower(): str(v) for k, v in headers.items()})


def _text(reply: Reply) -> str:
    if reply.body is None:
        return reply.text
    try:
        return json.dumps(reply.body)[:_MAX_SCANNED]
    except (TypeError, ValueError, RecursionError):
        return ""


def _message(body: Any) -> str:
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return message if isinstance(message, str) else ""


def _unified(reply: Reply) -> Outcome | None:
    """Anthropic's unified limits (a subscription's five-hour and seven-day windows):
    ``anthropic-ratelimit-unified-status: rejected``, refilled at the epoch second of
    ``anthropic-ratelimit-unified-reset``. No count to pace by: the refusal says when."""
    status = reply.header("anthropic-ratelimit-unified-status")
    if status is None or status.strip().lower() != "rejected":
        return None
    reset = reply.header("anthropic-ratelimit-unified-reset")
    hint = reply.hint_s
    if hint is None and reset is not None:
        hint = reset_s("epoch_or_delta", reset, time.time())
    if hint is None:
        return Outcome.fatal(reply.error(False), reason="daily_quota", value=reply.response)
    return Outcome.yielded(hint, "daily_quota", value=reply.response)


def daily_refusal(reply: Reply) -> Outcome | None:
    """The outcome of a 429 for a daily or monthly quota (see the module), else ``None``."""
    if reply.status != 429:
        return None
    unified = _unified(reply)
    if unified is not None:
        return unified
    body = reply.body
    if isinstance(body, list) and body:  # Gemini's OpenAI-compatible endpoint: a list
        body = body[0]
    if spent_quota(body) is not None:
        # Gemini's QuotaFailure naming a daily (or zero) quota: its retryDelay, or the
        # message's "Please retry in 52s", is no refill of it (the gemini dialect's rule).
        return Outcome.fatal(reply.error(False), reason="daily_quota", value=reply.response)
    readings = list(quota_readings(reply.response.headers))
    relayed = _relayed(reply.body)
    if relayed is not None:
        readings += quota_readings(relayed)
    spent = [r for r in readings if r.remaining < 1]
    long_spent = [r for r in spent if r.window_s is not None and r.window_s >= DAY]
    if not long_spent and not _SAID.search(_text(reply)):
        return None
    hint = reply.hint_s
    if hint is None:
        hint = message_hint_s(_message(body))
    if hint is None:
        resets = [r.reset_s for r in (long_spent or spent) if r.reset_s is not None]
        hint = max(resets) if resets else None
    if hint is None:
        return Outcome.fatal(reply.error(False), reason="daily_quota", value=reply.response)
    return Outcome.yielded(hint, "daily_quota", value=reply.response)
