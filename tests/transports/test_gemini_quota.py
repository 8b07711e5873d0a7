"""google-genai under a token budget of the caller's own: paced by the estimate, settled by usage.

The Gemini API sends no rate-limit headers, so a caller who knows their tier
gives the Gate a budget (``QuotaPolicy(tokens_per_minute=...)``). The real
google-genai client sends through the Gate's HTTP client to the fake Gemini API
of ``test_gemini_client``; the Gate charges each request, before it is sent,
what it reads in google-genai's own body (the text of ``systemInstruction`` and
``contents``, four characters a token, plus ``maxOutputTokens``), and settles
it to the ``usageMetadata`` of the answer, or of a stream's last chunk.

The budget refills at two tokens a second, so a request that the estimate
holds back would wait many seconds for the refill: the only thing that can
let it go within the test is the settlement of the requests before it.
"""

from __future__ import annotations

import json
import time
from typing import Any

import anyio
import pytest
from google import genai
from google.genai import types

import yieldgate
from tests.transports.test_gemini_client import API_KEY, MODEL, fake_gemini, options
from yieldgate import Gate, GatePolicy, QuotaPolicy
from yieldgate.dialects._cost import estimate_cost
from yieldgate.gate import Cost
from yieldgate.gate._cost import Bucket

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

LIMIT = 120  # tokens a minute: 2 a second
SYSTEM = "Be brief."
PROMPT = "Why is it blue?!"
# "system: Be brief.\nuser: Why is it blue?!" is 40 characters: 10 tokens.
PROMPT_TOKENS = 10
MAX_OUTPUT = 30
ESTIMATE = PROMPT_TOKENS + MAX_OUTPUT  # three fit in the budget, a fourth does not
# What the fake answers used: thoughts are output, counted apart from the candidates.
USAGE = {
    "promptTokenCount": 10,
    "candidatesTokenCount": 6,
    "thoughtsTokenCount": 4,
    "totalTokenCount": 20,
}
CONFIG = types.GenerateContentConfig(system_instruction=SYSTEM, max_output_tokens=MAX_OUTPUT)


def budgeted() -> Gate:
    return Gate(GatePolicy(quota=QuotaPolicy(tokens_per_minute=LIMIT, learn=False)), name="gemini")


def budget(gate: Gate) -> Bucket:
    bucket: Bucket = gate._core.upstreams[0].quota.buckets["policy:tokens"]
    return bucket


def assert_settled(gate: Gate, used: int, took_s: float) -> None:
    """The budget holds its limit less what the answers said they used, plus at most
    what refilled while the calls ran."""
    bucket = budget(gate)
    level = bucket.level_at(bucket.updated)
    refilled = LIMIT / 60 * took_s
    assert LIMIT - used - 1e-6 <= level <= LIMIT - used + refilled + 1e-6, (level, used, took_s)


def test_google_genais_own_body_is_read_as_gemini_meters_it() -> None:
    g = budgeted()
    with (
        fake_gemini() as fake,
        yieldgate.http_client(g, dialect="gemini", flavor="httpx2", sync=True) as http,
    ):
        client = genai.Client(api_key=API_KEY, http_options=options(http, True, base_url=fake.url))
        client.models.generate_content(model=MODEL, contents=PROMPT, config=CONFIG)
    (body,) = fake.bodies
    path = f"/v1/models/{MODEL}:generateContent"
    sent = json.dumps(body).encode()
    assert estimate_cost(sent, QuotaPolicy(), path=path) == Cost.of(
        PROMPT_TOKENS, MAX_OUTPUT, MODEL
    )


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_a_burst_is_paced_by_the_estimate_and_settled_by_usage_metadata(
    stream: bool,
) -> None:
    g = budgeted()
    with fake_gemini() as fake:
        fake.usage, fake.hold = USAGE, 3
        async with yieldgate.http_client(g, dialect="gemini", flavor="httpx2") as http:
            client = genai.Client(
                api_key=API_KEY, http_options=options(http, False, base_url=fake.url)
            )

            async def one(totals: list[int]) -> None:
                if stream:
                    chunks = await client.aio.models.generate_content_stream(
                        model=MODEL, contents=PROMPT, config=CONFIG
                    )
                    usage: Any = None
                    async for chunk in chunks:
                        usage = chunk.usage_metadata
                else:
                    reply = await client.aio.models.generate_content(
                        model=MODEL, contents=PROMPT, config=CONFIG
                    )
                    usage = reply.usage_metadata
                totals.append(usage.total_token_count)

            totals: list[int] = []
            started = time.monotonic()
            async with anyio.create_task_group() as tasks:
                for _ in range(4):
                    tasks.start_soon(one, totals)
                # Three estimates fill the budget; the server holds their answers.
                # Polled: the server's arrivals are another thread's, with no event to wait on.
                with anyio.fail_after(10):
                    while (len(fake.arrivals), g.statistics().calls) != (3, 4):  # noqa: ASYNC110
                        await anyio.sleep(0.01)
                # The fourth waits for the quota, holding no window slot, and nothing
                # but a settlement can make room for it within the next 20 s.
                assert g.statistics().window.inflight == 3
                assert budget(g).level_at(time.monotonic()) < ESTIMATE
                fake.release.set()
            took = time.monotonic() - started
    assert totals == [20] * 4
    assert fake.released == [False, False, False, True]  # the fourth went after the answers
    stats = g.statistics()
    assert (stats.calls_ok, stats.attempts, stats.yields) == (4, 4, 0)
    assert stats.waited_s > 0
    assert took < 10  # not the 20 s the refill alone would have taken
    assert_settled(g, sum(totals), took)


def test_sync_whole_and_streamed_answers_are_settled_by_their_usage_metadata() -> None:
    g = budgeted()
    with (
        fake_gemini() as fake,
        yieldgate.http_client(g, dialect="gemini", flavor="httpx2", sync=True) as http,
    ):
        fake.usage = USAGE
        client = genai.Client(api_key=API_KEY, http_options=options(http, True, base_url=fake.url))
        started = time.monotonic()
        reply = client.models.generate_content(model=MODEL, contents=PROMPT, config=CONFIG)
        chunks = list(
            client.models.generate_content_stream(model=MODEL, contents=PROMPT, config=CONFIG)
        )
        took = time.monotonic() - started
    # The stream's first chunk counts the prompt alone; its last has the final counts.
    first, last = chunks[0].usage_metadata, chunks[-1].usage_metadata
    assert first is not None
    assert last is not None
    assert reply.usage_metadata is not None
    assert (first.total_token_count, last.total_token_count) == (10, 20)
    assert last.thoughts_token_count == 4
    assert g.statistics().window.inflight == 0
    assert_settled(g, reply.usage_metadata.total_token_count + 20, took)
