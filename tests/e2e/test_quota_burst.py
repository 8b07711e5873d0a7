"""A burst past a provider's quota, through the official client on a Gate configured with nothing.

The reference server emulates OpenAI's quota (``--quota-tpm``, a short
window): buckets that refill continuously, a request charged its prompt
(characters / 4) plus ``max_tokens`` at the door, the ``x-ratelimit-*``
headers on every answer, and a 429 whose message says when to try again.
Chat requests of mixed sizes, costing the token quota and a half, go at once
through ``AsyncOpenAI`` on ``yieldgate.openai_client(Gate())``. The Gate
learns the quota from the first answers and paces the rest: every call
succeeds, hardly any is refused, and the burst ends about when the quota's
refill allows it to.

The bound is the server's refill time (what the burst costs beyond the first
full bucket, at the refill rate), not the machine's speed; the client's work
runs while it waits for the refill.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from typing import Any

import pytest

import yieldgate
from tests.conftest import http_stats
from yieldgate import Gate, GatePolicy, QuotaPolicy
from yieldgate.server import ServerProcess

pytestmark = pytest.mark.e2e

REQUESTS = 200
WINDOW_S = 12.0


def test_the_default_gate_paces_a_burst_by_the_quota_it_learns(serve: Any) -> None:
    rng = random.Random(19)
    jobs = [("x" * rng.choice((20, 200, 800)), rng.choice((16, 64, 128))) for _ in range(REQUESTS)]
    # The server's cost rule: the prompt as it reads it ("user: ..."), 4 characters a token.
    cost = sum(math.ceil(len(f"user: {text}") / 4) + max_tokens for text, max_tokens in jobs)
    tpm = math.ceil(cost / 1.5)
    server: ServerProcess = serve(
        "--http-port", "0", "--exec-ms", "20", "--max-inflight", "64",
        "--quota-tpm", str(tpm), "--quota-rpm", "100000", "--quota-window-s", str(WINDOW_S),
    )  # fmt: skip
    bound_s = (cost - tpm) / (tpm / WINDOW_S)

    answered: list[float] = []  # when each call returned

    async def burst() -> tuple[list[Any], float]:
        gate = Gate(name="provider")
        client = yieldgate.openai_client(gate, base_url=f"{server.http_url}/v1", api_key="unused")

        async def one(text: str, max_tokens: int) -> Any:
            try:
                return await client.chat.completions.create(
                    model="gpt-4o",
                    messages=[{"role": "user", "content": text}],
                    max_tokens=max_tokens,
                )
            finally:
                answered.append(time.monotonic())

        start = time.monotonic()
        results = await asyncio.gather(*(one(*job) for job in jobs), return_exceptions=True)
        await client.close()
        return results, start

    results, start = asyncio.run(burst())
    failures = [r for r in results if isinstance(r, BaseException)]
    assert failures == []
    counters = http_stats(server)
    refused = counters["quota_refused_tokens_total"] + counters["quota_refused_requests_total"]
    assert counters["quota_requests_charged_total"] == REQUESTS
    assert refused <= 0.02 * REQUESTS, counters
    # From the first answer, about when the quota began to refill (the Gate's first
    # request probes it alone). The first answer came 0.43-0.45 s after the go on
    # idle cores and 0.79-1.08 s with two CPU hogs beside the test, where the
    # makespan from the go was 6.8-7.1 s against a 6.9 s limit (failed CI once);
    # from the first answer it was 6.01-6.03 s against the 6.0 s refill, either way.
    first = min(answered)
    makespan = max(answered) - first
    assert makespan <= 1.15 * bound_s, (makespan, bound_s, "first answer at (s)", first - start)


def test_own_budgets_are_settled_by_a_streams_usage_chunk(serve: Any) -> None:
    server: ServerProcess = serve("--http-port", "0", "--exec-ms", "5")
    gate = Gate(GatePolicy(quota=QuotaPolicy(tokens_per_minute=600, learn=False)), name="own")

    async def chat() -> str:
        client = yieldgate.openai_client(gate, base_url=f"{server.http_url}/v1", api_key="x")
        async with client:
            stream = await client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": "hello world"}],
                max_tokens=300,
                stream=True,
                stream_options={"include_usage": True},
            )
            usage = None
            async for chunk in stream:
                usage = chunk.usage or usage
        assert usage is not None
        return str(usage.total_tokens)

    used = int(asyncio.run(chat()))
    bucket = gate._core.upstreams[0].quota.buckets["policy:tokens"]
    # Charged 5 + 300 before sending; settled to the stream's usage after it.
    assert used < 100
    assert bucket.level_at(bucket.updated) >= 600 - used - 1
