"""The provider zoo: one fake per provider users pay, written from its documentation.

Each ``Spec`` is a provider as its documentation (and 429 bodies users quote) says
it answers: the buckets it meters (what, how much, over what window), the headers it
writes on every answer, the 429 it sends when a bucket is short, and what it
charges a request at its door. ``Fake`` serves a spec as an ``httpx`` handler on a
clock (the test loop's virtual one): buckets refill continuously, as providers'
limits do, and a request is charged only if every bucket holds its cost.

A new provider is one ``Spec`` here and one row in ``_families.FAMILIES``.
docs/http.md's header table cites each provider's source.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx

MINUTE = 60.0
DAY = 86_400.0

# (limit, remaining, seconds until full) of each bucket, by its name in the spec.
States = Mapping[str, tuple[float, float, float]]


@dataclass(frozen=True)
class Limit:
    resource: str  # requests, tokens, input_tokens, output_tokens
    limit: float
    window_s: float = MINUTE


@dataclass(frozen=True)
class Spec:
    """A provider: its buckets, its headers on every answer, its 429, its dialect."""

    name: str
    limits: dict[str, Limit]
    headers: Callable[[States], dict[str, str]]
    refusal: Callable[[str, float, States], tuple[dict[str, Any], dict[str, str]]]
    dialect: str = "openai"
    sends_quota: bool = True  # the headers describe the binding bucket
    answered_model: str = "model-x"
    extra: dict[str, str] = field(default_factory=dict)


class Fake:
    """``spec`` served on ``clock``: continuous buckets, charged at the door."""

    def __init__(self, spec: Spec, clock: Callable[[], float], lib: Any = httpx) -> None:
        self.spec = spec
        self.lib = lib  # httpx or httpx2: the library of the client under test
        self.clock = clock
        now = clock()
        self.level = {k: v.limit for k, v in spec.limits.items()}
        self.updated = dict.fromkeys(spec.limits, now)
        self.served = 0
        self.refused = 0

    def _refill(self, now: float) -> None:
        for key, limit in self.spec.limits.items():
            rate = limit.limit / limit.window_s
            self.level[key] = min(limit.limit, self.level[key] + (now - self.updated[key]) * rate)
            self.updated[key] = now

    def states(self) -> dict[str, tuple[float, float, float]]:
        out = {}
        for key, limit in self.spec.limits.items():
            level = max(0.0, self.level[key])
            full = (limit.limit - level) / (limit.limit / limit.window_s)
            out[key] = (limit.limit, math.floor(level), full)
        return out

    def handle(self, request: Any) -> Any:
        body = json.loads(request.content)
        prompt = sum(math.ceil(len(f"{m['role']}: {m['content']}") / 4) for m in body["messages"])
        amounts = {
            "requests": 1,
            "tokens": prompt + body["max_tokens"],
            "input_tokens": prompt,
            "output_tokens": body["max_tokens"],
        }
        now = self.clock()
        self._refill(now)
        limits = self.spec.limits
        short = [
            (key, (amounts[lim.resource] - self.level[key]) / (lim.limit / lim.window_s))
            for key, lim in limits.items()
            if amounts[lim.resource] > self.level[key]
        ]
        if short:
            self.refused += 1
            key, wait = max(short, key=lambda s: s[1])
            payload, headers = self.spec.refusal(key, wait, self.states())
            return self.lib.Response(
                429, json=payload, headers={**self.spec.headers(self.states()), **headers}
            )
        for key, lim in limits.items():
            self.level[key] -= amounts[lim.resource]
        self.served += 1
        answer = {
            "id": f"cmpl-{self.served}",
            "object": "chat.completion",
            "created": 0,
            "model": self.spec.answered_model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "ok"},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": prompt, "completion_tokens": 1, "total_tokens": prompt + 1},
        }
        return self.lib.Response(200, json=answer, headers=self.spec.headers(self.states()))


# -- header writers ----------------------------------------------------------------------


def _go(seconds: float) -> str:
    minutes, rest = divmod(max(0.0, seconds), 60)
    return f"{int(minutes)}m{rest:.3f}s" if minutes else f"{rest:.3f}s"


def _openai_names(states: States, names: Mapping[str, str], infix: str = "") -> dict[str, str]:
    out = {}
    for key, what in names.items():
        limit, remaining, full = states[key]
        out[f"x-ratelimit-limit-{infix}{what}"] = f"{limit:.0f}"
        out[f"x-ratelimit-remaining-{infix}{what}"] = f"{remaining:.0f}"
        out[f"x-ratelimit-reset-{infix}{what}"] = _go(full)
    return out


def _openai_429(what: str, wait: float) -> tuple[dict[str, Any], dict[str, str]]:
    message = (
        f"Rate limit reached for gpt-4o in organization org-zoo on {what}: Limit 1, Used 1, "
        f"Requested 1. Please try again in {wait:.3f}s. Visit https://platform.openai.com/"
        "account/rate-limits to learn more."
    )
    body = {
        "error": {
            "message": message,
            "type": "tokens",
            "param": None,
            "code": "rate_limit_exceeded",
        }
    }
    return body, {}


def wall() -> float:
    """The provider's wall clock (a test may set it apart from the client's)."""
    return time.time()


def _rfc3339(seconds: float) -> str:
    return datetime.fromtimestamp(wall() + seconds, UTC).isoformat().replace("+00:00", "Z")


def _anthropic_headers(states: States) -> dict[str, str]:
    out = {}
    for key, infix in (
        ("requests", "requests"),
        ("input", "input-tokens"),
        ("output", "output-tokens"),
    ):
        limit, remaining, full = states[key]
        out[f"anthropic-ratelimit-{infix}-limit"] = f"{limit:.0f}"
        out[f"anthropic-ratelimit-{infix}-remaining"] = f"{remaining:.0f}"
        out[f"anthropic-ratelimit-{infix}-reset"] = _rfc3339(full)
    return out


def _plain_triple(states: States, key: str, reset: Callable[[float], str]) -> dict[str, str]:
    limit, remaining, full = states[key]
    return {
        "X-RateLimit-Limit": f"{limit:.0f}",
        "X-RateLimit-Remaining": f"{remaining:.0f}",
        "X-RateLimit-Reset": reset(full),
    }


def _epoch_ms(seconds: float) -> str:
    return f"{(wall() + seconds) * 1000:.0f}"


def _windowed(states: States, rows: Mapping[str, str]) -> dict[str, str]:
    out = {}
    for key, suffix in rows.items():
        limit, remaining, full = states[key]
        out[f"x-ratelimit-limit-{suffix}"] = f"{limit:.0f}"
        out[f"x-ratelimit-remaining-{suffix}"] = f"{remaining:.0f}"
        out[f"x-ratelimit-reset-{suffix}"] = f"{full:.2f}"
    return out


def _ceil_s(wait: float) -> str:
    return str(max(1, math.ceil(wait)))


# -- the zoo -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Quotas:
    """The binding quotas a burst is run against: ``tpm`` tokens a minute,
    ``binding_rpm`` requests a minute where a provider meters only requests in headers
    (OpenRouter), ``itpm`` input and ``otpm`` output tokens a minute where it meters
    them apart; per second (Together, Fireworks) the same rates, each second's bucket
    at least the burst's largest request (``tps``, ``itps``, ``otps``)."""

    tpm: float
    binding_rpm: float
    itpm: float
    otpm: float
    tps: float
    itps: float
    otps: float


def quotas(burst: list[tuple[int, int]], share: float = 1 / 1.5) -> Quotas:
    """The quotas for ``burst`` (each call's prompt and output tokens): ``share`` of its
    cost, so the burst exceeds them by half by default."""
    inputs = sum(i for i, _ in burst)
    outputs = sum(o for _, o in burst)
    return Quotas(
        tpm=math.ceil((inputs + outputs) * share),
        binding_rpm=math.ceil(len(burst) * share),
        itpm=math.ceil(inputs * share),
        otpm=math.ceil(outputs * share),
        tps=max(math.ceil((inputs + outputs) * share / 60), max(i + o for i, o in burst)),
        itps=max(math.ceil(inputs * share / 60), max(i for i, _ in burst)),
        otps=max(math.ceil(outputs * share / 60), max(o for _, o in burst)),
    )


def specs(q: Quotas, rpm: float = 100_000) -> list[Spec]:
    """Every provider, metering as its documentation says, bound by ``q``."""
    tpm, binding_rpm, itpm, otpm = q.tpm, q.binding_rpm, q.itpm, q.otpm
    return [
        Spec(
            "openai",
            {"requests": Limit("requests", rpm), "tokens": Limit("tokens", tpm)},
            lambda s: _openai_names(s, {"requests": "requests", "tokens": "tokens"}),
            lambda key, wait, s: _openai_429("tokens per min (TPM)", wait),
            answered_model="gpt-4o-2024-08-06",
        ),
        Spec(
            "openai-project",
            {
                "requests": Limit("requests", rpm * 10),
                "tokens": Limit("tokens", tpm * 10),
                "project": Limit("tokens", tpm),
            },
            lambda s: {
                **_openai_names(s, {"requests": "requests", "tokens": "tokens"}),
                **_openai_names(s, {"project": "tokens"}, "project-"),
            },
            lambda key, wait, s: _openai_429("tokens per min (TPM) for project proj_zoo", wait),
        ),
        Spec(
            "azure",
            {"requests": Limit("requests", rpm), "tokens": Limit("tokens", tpm)},
            lambda s: {
                "x-ratelimit-remaining-requests": f"{s['requests'][1]:.0f}",
                "x-ratelimit-remaining-tokens": f"{s['tokens'][1]:.0f}",
            },
            lambda key, wait, s: (
                {
                    "error": {
                        "code": "429",
                        "message": "Requests to the ChatCompletions_Create Operation under "
                        "Azure OpenAI API version 2024-10-21 have exceeded token rate limit of "
                        f"your current OpenAI S0 pricing tier. Please retry after {_ceil_s(wait)}"
                        " seconds.",
                    }
                },
                {"retry-after": _ceil_s(wait), "retry-after-ms": f"{wait * 1000:.0f}"},
            ),
        ),
        Spec(
            "groq",
            {"requests": Limit("requests", 14_400, DAY), "tokens": Limit("tokens", tpm)},
            lambda s: {
                "x-groq-region": "us-east-1",
                **_openai_names(s, {"requests": "requests", "tokens": "tokens"}),
            },
            lambda key, wait, s: (
                _openai_429("tokens per minute (TPM)", wait)[0],
                {"retry-after": _ceil_s(wait)},
            ),
        ),
        Spec(
            "mistral",
            {"minute": Limit("tokens", tpm), "month": Limit("tokens", 1e9, 30 * DAY)},
            lambda s: _windowed(s, {"minute": "tokens-minute", "month": "tokens-month"}),
            lambda key, wait, s: (
                {
                    "object": "error",
                    "message": "Requests rate limit exceeded",
                    "type": "rate_limited",
                    "param": None,
                    "code": "1300",
                },
                {},
            ),
        ),
        Spec(
            "openrouter",
            {"requests": Limit("requests", binding_rpm)},
            lambda s: _plain_triple(s, "requests", _epoch_ms),
            lambda key, wait, s: (
                {
                    "error": {
                        "message": "Rate limit exceeded: limit_rpm/zoo/model-x",
                        "code": 429,
                        "metadata": {"headers": _plain_triple(s, "requests", _epoch_ms)},
                    }
                },
                {},
            ),
        ),
        Spec(
            "together",  # per second
            {"requests": Limit("requests", rpm / 60, 1.0), "tokens": Limit("tokens", q.tps, 1.0)},
            lambda s: {
                **_plain_triple(s, "requests", lambda full: f"{full:.0f}"),
                "x-tokenlimit-limit": f"{s['tokens'][0]:.0f}",
                "x-tokenlimit-remaining": f"{s['tokens'][1]:.0f}",
            },
            lambda key, wait, s: (
                {
                    "id": "zoo",
                    "error": {
                        "message": "You are on tier Build Tier 1, which offers 600 queries and "
                        "180000 tokens per minute.",
                        "type": "model_rate_limit",
                        "param": None,
                        "code": None,
                    },
                },
                {},
            ),
        ),
        Spec(
            "fireworks",
            {
                "requests": Limit("requests", rpm),
                "prompt": Limit("input_tokens", q.itps, 1.0),  # per second
                "generated": Limit("output_tokens", q.otps, 1.0),
            },
            lambda s: {
                **_openai_names(s, {"requests": "requests"}),
                **_windowed(s, {"prompt": "tokens-prompt", "generated": "tokens-generated"}),
            },
            lambda key, wait, s: (
                {"error": {"message": "rate limit exceeded", "code": "RATE_LIMIT_EXCEEDED"}},
                {"x-ratelimit-over-limit": "yes"},
            ),
        ),
        Spec(
            "cerebras",
            {"day": Limit("requests", 14_400, DAY), "minute": Limit("tokens", tpm)},
            lambda s: _windowed(s, {"day": "requests-day", "minute": "tokens-minute"}),
            lambda key, wait, s: (
                {
                    "message": "Tokens per minute limit exceeded - too many tokens processed.",
                    "type": "too_many_tokens_error",
                    "param": "quota",
                    "code": "token_quota_exceeded",
                },
                {},
            ),
        ),
        Spec(
            "anthropic",
            {
                "requests": Limit("requests", rpm),
                "input": Limit("input_tokens", itpm),
                "output": Limit("output_tokens", otpm),
            },
            _anthropic_headers,
            lambda key, wait, s: (
                {
                    "type": "error",
                    "error": {
                        "type": "rate_limit_error",
                        "message": "This request would exceed the rate limit for your "
                        "organization of input tokens per minute.",
                    },
                },
                {"retry-after": _ceil_s(wait)},
            ),
            dialect="anthropic",
        ),
        Spec(
            "ietf",
            {"tokens": Limit("tokens", tpm)},
            lambda s: {
                "RateLimit-Policy": f'"tpm";q={s["tokens"][0]:.0f};w=60;qu="tokens"',
                "RateLimit": f'"tpm";r={s["tokens"][1]:.0f};t={math.ceil(s["tokens"][2])}',
            },
            lambda key, wait, s: (
                {"error": {"message": "quota exceeded"}},
                {"retry-after": _ceil_s(wait)},
            ),
        ),
        Spec(
            "cohere",
            {"requests": Limit("requests", rpm), "tokens": Limit("tokens", tpm)},
            lambda s: {},
            lambda key, wait, s: (
                {"message": "You are past the per minute request limit."},
                {},
            ),
            sends_quota=False,
        ),
    ]
