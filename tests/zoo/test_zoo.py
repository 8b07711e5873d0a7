"""A burst through a default Gate and the provider's official client, for every provider.

Every provider of ``providers.specs``: ``CALLS`` chat completions fired at once through
``AsyncOpenAI`` (``AsyncAnthropic`` for Anthropic) on ``yieldgate.http_client(Gate())``,
the burst half again the provider's binding quota. Where the provider says its quota
in headers, at most 2% of the attempts may meet a 429; everywhere, every call succeeds
(no client-side refusal, no spent-quota error) and the burst ends near the quota's
bound: what is past the first full bucket, at its refill rate (no stall).
"""

from __future__ import annotations

import math
import random
from typing import Any

import anyio
import httpx2
import pytest

import yieldgate
from tests.zoo.providers import Fake, Spec, quotas, specs
from yieldgate import Gate

pytestmark = pytest.mark.anyio

CALLS = 60


def jobs(seed: int = 7) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    return [("x" * rng.choice((40, 400, 1600)), rng.choice((16, 64, 256))) for _ in range(CALLS)]


def cost(text: str, max_tokens: int) -> int:
    return math.ceil(len(f"user: {text}") / 4) + max_tokens


def zoo() -> list[Spec]:
    """Every provider, its binding quota two thirds of what the burst costs."""
    return specs(quotas([(math.ceil(len(f"user: {t}") / 4), m) for t, m in jobs()]))


def bound_s(spec: Spec) -> float:
    """What is past the binding bucket's first fill, at its refill rate."""
    worst = 0.0
    for limit in spec.limits.values():
        amounts = {
            "requests": [1] * CALLS,
            "tokens": [cost(*job) for job in jobs()],
            "input_tokens": [math.ceil(len(f"user: {t}") / 4) for t, _ in jobs()],
            "output_tokens": [m for _, m in jobs()],
        }[limit.resource]
        worst = max(worst, (sum(amounts) - limit.limit) / (limit.limit / limit.window_s))
    return worst


async def burst(spec: Spec, client: Any) -> tuple[list[BaseException], float]:
    errors: list[BaseException] = []

    async def one(text: str, max_tokens: int) -> None:
        messages = [{"role": "user", "content": text}]
        try:
            if spec.dialect == "anthropic":
                await client.messages.create(
                    model="claude-zoo", messages=messages, max_tokens=max_tokens
                )
            else:
                await client.chat.completions.create(
                    model="model-x", messages=messages, max_tokens=max_tokens
                )
        except Exception as exc:
            errors.append(exc)

    start = anyio.current_time()
    async with anyio.create_task_group() as tg:
        for job in jobs():
            tg.start_soon(one, *job)
    return errors, anyio.current_time() - start


def official(spec: Spec, http_client: Any, **kwargs: Any) -> Any:
    if spec.dialect == "anthropic":
        import anthropic

        return anthropic.AsyncAnthropic(
            api_key="zoo", base_url="http://zoo", http_client=http_client, **kwargs
        )
    import openai

    return openai.AsyncOpenAI(
        api_key="zoo", base_url="http://zoo/v1", http_client=http_client, **kwargs
    )


@pytest.mark.parametrize("spec", zoo(), ids=lambda spec: spec.name)
async def test_a_burst_through_a_default_gate(spec: Spec) -> None:
    fake = Fake(spec, anyio.current_time, httpx2)
    gate = Gate(name=f"zoo-{spec.name}")
    inner = httpx2.MockTransport(fake.handle)
    client = official(
        spec, yieldgate.http_client(gate, dialect=spec.dialect, inner=inner), max_retries=0
    )
    errors, makespan = await burst(spec, client)
    await client.close()
    assert errors == [], errors[:3]
    assert fake.served == CALLS
    bound = bound_s(spec)
    if spec.sends_quota:
        assert fake.refused <= 0.02 * CALLS, (fake.refused, makespan, bound)
        assert makespan <= 1.25 * bound, (makespan, bound, fake.refused)
    else:  # the window and the hints alone
        assert makespan <= 2.0 * bound, (makespan, bound, fake.refused)
    await gate.aclose()
