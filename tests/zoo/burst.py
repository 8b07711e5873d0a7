"""The zoo's burst, shared by its test and bench/providers.py: the jobs, their costs by
the providers' rule, the quota's bound, the official client, and the burst itself."""

from __future__ import annotations

import math
import random
from typing import Any

import anyio

from tests.zoo.providers import Spec, quotas, specs

__all__ = ["bound_s", "fire", "jobs", "official", "zoo"]


def jobs(calls: int, seed: int) -> list[tuple[str, int]]:
    """``calls`` chat completions: a prompt's text and its ``max_tokens``, mixed sizes."""
    rng = random.Random(seed)
    return [("x" * rng.choice((40, 400, 1600)), rng.choice((16, 64, 256))) for _ in range(calls)]


def _prompt(text: str) -> int:
    return math.ceil(len(f"user: {text}") / 4)  # as the fakes charge a prompt


def zoo(burst: list[tuple[str, int]]) -> list[Spec]:
    """Every provider, bound by two thirds of what ``burst`` costs it."""
    return specs(quotas([(_prompt(text), max_tokens) for text, max_tokens in burst]))


def bound_s(spec: Spec, burst: list[tuple[str, int]]) -> float:
    """What is past the binding bucket's first fill, at its refill rate."""
    amounts = {
        "requests": [1] * len(burst),
        "tokens": [_prompt(t) + m for t, m in burst],
        "input_tokens": [_prompt(t) for t, _ in burst],
        "output_tokens": [m for _, m in burst],
    }
    return max(
        (sum(amounts[limit.resource]) - limit.limit) / (limit.limit / limit.window_s)
        for limit in spec.limits.values()
    )


def official(spec: Spec, http_client: Any, **kwargs: Any) -> Any:
    """The provider's official async client on ``http_client``."""
    if spec.dialect == "anthropic":
        import anthropic

        return anthropic.AsyncAnthropic(
            api_key="zoo", base_url="http://zoo", http_client=http_client, **kwargs
        )
    import openai

    return openai.AsyncOpenAI(
        api_key="zoo", base_url="http://zoo/v1", http_client=http_client, **kwargs
    )


async def fire(
    spec: Spec, client: Any, burst: list[tuple[str, int]]
) -> tuple[list[BaseException], float]:
    """Every call of ``burst`` at once through ``client``: the errors, the makespan."""
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
        for job in burst:
            tg.start_soon(one, *job)
    return errors, anyio.current_time() - start
