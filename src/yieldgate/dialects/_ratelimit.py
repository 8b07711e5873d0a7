"""Reading a provider's quota out of its rate-limit headers.

Two kinds, each turned into ``QuotaReading``s (a bucket's limit, what remains of
it, how long until it is full again and, when said, the window its limit is for):

- The providers' own header families, one row each in ``_families.FAMILIES``
  (OpenAI and Azure OpenAI, OpenAI's project limits, Groq, Anthropic, Cerebras
  and Mistral's window-suffixed headers, Fireworks, Together, OpenRouter's and
  many gateways' plain ``X-RateLimit-*``). Azure sends ``x-ratelimit-remaining-*``
  alone: a reading with no limit, which the quota learns from what remains.
- The IETF fields (draft-ietf-httpapi-ratelimit-headers), read when no family
  row matched: ``RateLimit-Policy`` (``"name";q=100;w=60``, with a quota unit
  ``qu``) and ``RateLimit`` (``"name";r=50;t=30``; a partition key ``pk`` makes a
  bucket of its own), draft 7's dictionaries (``RateLimit: limit=100,
  remaining=50, reset=30`` with ``RateLimit-Policy: 100;w=60``) and the older
  ``RateLimit-Limit`` / ``-Remaining`` / ``-Reset`` form (``RateLimit-Limit: 100,
  100;w=60``).

A value that cannot be read is ignored, never raised: a malformed header must
not turn a good answer into a crash. A bucket needs at least its limit and
what remains; without a reset it is read as full a window (a minute) later.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Mapping
from datetime import datetime

from yieldgate.dialects._families import FAMILIES, ResetFormat
from yieldgate.gate._cost import SCOPE_MARK
from yieldgate.gate._quota import QuotaReading

__all__ = ["go_duration_s", "quota_readings", "reset_s"]

# The IETF quota units this Gate can pace; other units (content-bytes,
# concurrent-requests) are not a rate it spends per request.
_IETF_UNITS = {"requests": "requests", "tokens": "tokens"}

# A reset past these is a time, not a delay: epoch milliseconds, epoch seconds.
_EPOCH_MS = 1e12
_EPOCH_S = 1e9

_GO_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|h|m|s)")
_GO_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_GO_WHOLE = re.compile(r"(?:(?:\d+(?:\.\d*)?|\.\d+)(?:ns|us|µs|ms|h|m|s))+")


def _count(text: str | None) -> float | None:
    """A non-negative finite number, or ``None``."""
    if text is None:
        return None
    try:
        value = float(text.strip())
    except ValueError:
        return None
    return value if value >= 0 and math.isfinite(value) else None


def go_duration_s(text: str) -> float | None:
    """A Go duration (``6m0s``, ``1.5s``, ``20ms``) or a bare number of seconds."""
    text = text.strip()
    plain = _count(text)
    if plain is not None:
        return plain
    if not _GO_WHOLE.fullmatch(text):
        return None
    total = sum(float(n) * _GO_UNIT_S[unit] for n, unit in _GO_PART.findall(text))
    return total if math.isfinite(total) else None


def _rfc3339_delay_s(text: str, now: float) -> float | None:
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - now)


def _reading(
    key: str,
    resource: str,
    limit: float | None,
    remaining: float | None,
    reset_s: float | None,
    window_s: float | None = None,
) -> QuotaReading | None:
    if remaining is None or (limit is not None and limit < 1):
        return None  # a limit below one request or token fits nothing
    if limit is None:  # what remains, alone (Azure)
        return QuotaReading(key=key, resource=resource, limit=None, remaining=remaining)
    return QuotaReading(
        key=key,
        resource=resource,
        limit=limit,
        remaining=min(remaining, limit),
        reset_s=reset_s,
        window_s=window_s if window_s is not None and window_s > 0 else None,
    )


def reset_s(form: ResetFormat, text: str, now: float) -> float | None:
    """Seconds until a bucket is full again, from its reset header written as ``form``."""
    if form == "duration":
        return go_duration_s(text)
    if form == "rfc3339":
        return _rfc3339_delay_s(text, now)
    value = _count(text)
    if value is None:
        return None
    if value >= _EPOCH_MS:
        return max(0.0, value / 1000 - now)
    if value >= _EPOCH_S:
        return max(0.0, value - now)
    return value


def _families(headers: Mapping[str, str], now: float) -> list[QuotaReading]:
    """The buckets of every row of ``FAMILIES`` the headers carry; a header one row
    read is not read again by a later row."""
    found: list[QuotaReading] = []
    read: set[str] = set()
    for family in FAMILIES:
        if family.marker is not None and family.marker not in headers:
            continue
        for bucket in family.buckets:
            remaining_text = headers.get(bucket.remaining)
            if remaining_text is None or bucket.remaining in read:
                continue
            read.update((bucket.limit, bucket.remaining))
            limit_text = headers.get(bucket.limit)
            limit = _count(limit_text)
            if limit is None and limit_text is not None:
                continue  # a limit sent and unreadable: nothing to learn from what remains
            reset = None if bucket.reset is None else headers.get(bucket.reset)
            reading = _reading(
                f"{family.key}:{bucket.name or bucket.resource}",
                bucket.resource,
                limit,
                _count(remaining_text),
                None if reset is None else reset_s(family.reset, reset, now),
                bucket.window_s,
            )
            if reading is not None:
                found.append(reading)
    return found


# -- the IETF fields: a small reader of structured-field lists --------------------

_ITEM = re.compile(r'\s*(?:"((?:[^"\\]|\\.)*)"|([A-Za-z*][A-Za-z0-9_.:/*-]*)|(-?\d+(?:\.\d+)?))')
_PARAM = re.compile(
    r"\s*;\s*([a-z*][a-z0-9_.*-]*)"
    r'(?:=(?:"((?:[^"\\]|\\.)*)"|(-?\d+(?:\.\d+)?)|([A-Za-z*][^\s;,]*)|(:[A-Za-z0-9+/=]*:)))?'
)


def _sf_list(text: str) -> list[tuple[str, dict[str, str]]]:
    """A structured-field list: each member's value (as text) and its parameters.

    Stops at the first member it cannot read: what came before it stands.
    """
    members: list[tuple[str, dict[str, str]]] = []
    pos = 0
    while pos < len(text):
        match = _ITEM.match(text, pos)
        if match is None:
            break
        value = next(g for g in match.groups() if g is not None)
        pos = match.end()
        params: dict[str, str] = {}
        while (param := _PARAM.match(text, pos)) is not None:
            name, quoted, number, token, octets = param.groups()
            given = (quoted, number, token, octets)
            params[name] = next((v for v in given if v is not None), "?1")
            pos = param.end()
        members.append((value, params))
        rest = text[pos:].lstrip()
        if not rest:
            break
        if not rest.startswith(","):
            break
        pos = len(text) - len(rest) + 1
    return members


_DICT_MEMBER = re.compile(r"([a-z*][a-z0-9_.*-]*)\s*=\s*(\d+(?:\.\d+)?)")


def _ietf_dictionary(state: str, policy: str | None) -> list[QuotaReading]:
    """Draft 7's form: ``RateLimit: limit=100, remaining=50, reset=30`` (a dictionary),
    its window in ``RateLimit-Policy: 100;w=60`` (the member whose quota is the limit)."""
    fields = dict(_DICT_MEMBER.findall(state))
    limit = fields.get("limit")
    window = None
    if policy is not None and limit is not None:
        members = _sf_list(policy)
        window = next((_count(p.get("w")) for v, p in members if v == limit and "w" in p), None)
    reading = _reading(
        "ietf:default",
        "requests",
        _count(limit),
        _count(fields.get("remaining")),
        _count(fields.get("reset")),
        window,
    )
    return [] if reading is None else [reading]


def _ietf(headers: Mapping[str, str]) -> list[QuotaReading]:
    found = []
    policy_field = headers.get("ratelimit-policy")
    state_field = headers.get("ratelimit")
    if state_field is not None and "remaining" in dict(_DICT_MEMBER.findall(state_field)):
        return _ietf_dictionary(state_field, policy_field)
    if state_field is not None and policy_field is not None:
        policies = {name: params for name, params in _sf_list(policy_field)}
        for name, params in _sf_list(state_field):
            policy = policies.get(name)
            if policy is None:
                continue
            unit = _IETF_UNITS.get(policy.get("qu", "requests"))
            if unit is None:
                continue
            # A partition key (``pk``, a byte sequence) names one partition of the
            # policy's quota (a user's, a key's): a bucket of its own.
            partition = params.get("pk", "")
            key = f"ietf:{name.replace(SCOPE_MARK, '_')}{partition}"
            reading = _reading(
                key,
                unit,
                _count(policy.get("q")),
                _count(params.get("r")),
                _count(params.get("t")),
                _count(policy.get("w")),
            )
            if reading is not None:
                found.append(reading)
        return found
    limit_field = headers.get("ratelimit-limit")
    if limit_field is None:
        return found
    members = _sf_list(limit_field)
    if not members:
        return found
    limit = members[0][0]
    # "100, 100;w=60": the limit, then the policies it comes from, with their windows.
    window = next((_count(p.get("w")) for v, p in members if v == limit and "w" in p), None)
    if window is None and policy_field is not None:
        first = _sf_list(policy_field)
        window = _count(first[0][1].get("w")) if first else None
    reset = headers.get("ratelimit-reset")
    reading = _reading(
        "ietf:default",
        "requests",
        _count(limit),
        _count(headers.get("ratelimit-remaining")),
        None if reset is None else _count(reset),
        window,
    )
    if reading is not None:
        found.append(reading)
    return found


def quota_readings(
    headers: Mapping[str, str], *, now: Callable[[], float] = time.time
) -> tuple[QuotaReading, ...]:
    """Every quota bucket ``headers`` describe (empty when they describe none).

    ``headers`` must look names up case-insensitively (httpx's ``Headers``
    does); ``now`` is the wall clock an Anthropic reset time is measured
    against. Never raises on a malformed value: that bucket is skipped.
    """
    try:
        found = _families(headers, now())
        if not found:
            found = _ietf(headers)
    except (AttributeError, TypeError):  # headers of an unexpected shape
        return ()
    return tuple(found)
