"""Reading a provider's quota out of its rate-limit headers.

Three families, each turned into ``QuotaReading``s (a bucket's limit, what
remains of it and how long until it is full again):

- OpenAI and Azure OpenAI: ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}``,
  the resets as Go durations (``6m0s``, ``1s``, ``20ms``, ``1.234s``). Azure sends
  ``x-ratelimit-remaining-*`` alone: a reading with no limit, which the quota
  learns from what remains.
- Anthropic: ``anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-
  {limit,remaining,reset}``, the resets as RFC 3339 times.
- The IETF fields (draft-ietf-httpapi-ratelimit-headers): ``RateLimit-Policy``
  (``"name";q=100;w=60``, with a quota unit ``qu``) and ``RateLimit``
  (``"name";r=50;t=30``; a partition key ``pk`` makes a bucket of its own),
  and the older ``RateLimit-Limit`` / ``-Remaining`` / ``-Reset`` form
  (``RateLimit-Limit: 100, 100;w=60``).

A value that cannot be read is ignored, never raised: a malformed header must
not turn a good answer into a crash. A bucket needs at least its limit and
what remains; without a reset it is read as full a window (a minute) later.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime

from yieldgate.gate._cost import SCOPE_MARK
from yieldgate.gate._quota import QuotaReading

__all__ = ["go_duration_s", "quota_readings"]

_OPENAI = (("requests", "requests"), ("tokens", "tokens"))
_ANTHROPIC = (
    ("requests", "requests"),
    ("tokens", "tokens"),
    ("input-tokens", "input_tokens"),
    ("output-tokens", "output_tokens"),
)
# The IETF quota units this Gate can pace; other units (content-bytes,
# concurrent-requests) are not a rate it spends per request.
_IETF_UNITS = {"requests": "requests", "tokens": "tokens"}

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


def _family(
    headers: Mapping[str, str],
    family: str,
    names: Sequence[tuple[str, str]],
    name: Callable[[str, str], str],
    reset_s: Callable[[str], float | None],
) -> list[QuotaReading]:
    """The buckets of one family of ``{limit, remaining, reset}`` headers: ``name(part,
    infix)`` spells each header, ``reset_s`` reads a reset."""
    found = []
    for infix, resource in names:
        limit = _count(headers.get(name("limit", infix)))
        if limit is None and name("limit", infix) in headers:
            continue  # a limit sent and unreadable: nothing to learn from what remains
        reset = headers.get(name("reset", infix))
        reading = _reading(
            f"{family}:{resource}",
            resource,
            limit,
            _count(headers.get(name("remaining", infix))),
            None if reset is None else reset_s(reset),
        )
        if reading is not None:
            found.append(reading)
    return found


def _openai(headers: Mapping[str, str]) -> list[QuotaReading]:
    return _family(
        headers, "openai", _OPENAI, lambda part, infix: f"x-ratelimit-{part}-{infix}", go_duration_s
    )


def _anthropic(headers: Mapping[str, str], now: float) -> list[QuotaReading]:
    return _family(
        headers,
        "anthropic",
        _ANTHROPIC,
        lambda part, infix: f"anthropic-ratelimit-{infix}-{part}",
        lambda text: _rfc3339_delay_s(text, now),
    )


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


def _ietf(headers: Mapping[str, str]) -> list[QuotaReading]:
    found = []
    policy_field = headers.get("ratelimit-policy")
    state_field = headers.get("ratelimit")
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
        found = _openai(headers)
        if not found:
            found = _anthropic(headers, now())
        if not found:
            found = _ietf(headers)
    except (AttributeError, TypeError):  # headers of an unexpected shape
        return ()
    return tuple(found)
