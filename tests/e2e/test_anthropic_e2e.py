"""anthropic's official client, unmodified, on one Gate, against the server's Messages route.

32 coroutines call through ``yieldgate.anthropic_client(gate)`` while 16
threads call through the sync one, all on ONE Gate, against ``yieldgate
serve`` with 4 slots: half of each stream their answers, which the SDK
parses from the server's event stream. Every call must succeed, the server
must never run more than 4 at once, and the shared window must keep the
attempts per request at 1.5 or fewer. The threads start as soon as they are
made, as an application's do: nothing lines them up with the coroutines.

Then a burst past an Anthropic-style quota (requests, input tokens and
output tokens metered apart) through the same client on a Gate configured
with nothing: the Gate learns the buckets from the ``anthropic-ratelimit-*``
headers and paces the rest, so every call succeeds and at most 2% of them
meet a 429.
"""

from __future__ import annotations

import asyncio
import math
import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

import yieldgate
from tests.conftest import http_stats
from yieldgate import Gate
from yieldgate.server import ServerProcess, spawn

pytestmark = pytest.mark.e2e

TASKS = 32
THREADS = 16
SLOTS = 4
LIMIT_S = 120.0


@pytest.fixture
def server() -> Iterator[ServerProcess]:
    with spawn("--max-inflight", str(SLOTS), "--exec-ms", "50", http=True) as proc:
        yield proc


def text_of(message: anthropic.types.Message) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


def test_tasks_and_threads_on_one_gate_share_four_slots(server: ServerProcess) -> None:
    gate = Gate(name="claude")
    base = server.http_url
    results: list[tuple[str, str]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    sync_client = yieldgate.anthropic_client(gate, sync=True, base_url=base, api_key="unused")

    def thread_call(i: int) -> None:
        messages: Any = [{"role": "user", "content": f"thread {i}"}]
        try:
            if i % 2:
                with sync_client.messages.stream(
                    model="claude-x", max_tokens=64, messages=messages
                ) as stream:
                    text = "".join(stream.text_stream)
                    final = stream.get_final_message()
                assert text == text_of(final)
                assert final.usage.output_tokens >= 1
            else:
                reply = sync_client.messages.create(
                    model="claude-x", max_tokens=64, messages=messages
                )
                text = text_of(reply)
            with lock:
                results.append((f"thread {i}", text))
        except BaseException as exc:
            with lock:
                errors.append(exc)

    async def tasks() -> None:
        async with yieldgate.anthropic_client(gate, base_url=base, api_key="unused") as client:

            async def one(i: int) -> None:
                messages: Any = [{"role": "user", "content": f"task {i}"}]
                if i % 2:
                    pieces = []
                    events = await client.messages.create(
                        model="claude-x", max_tokens=64, messages=messages, stream=True
                    )
                    async with events:
                        async for event in events:
                            if event.type == "content_block_delta":
                                assert event.delta.type == "text_delta"
                                pieces.append(event.delta.text)
                    text = "".join(pieces)
                else:
                    text = text_of(
                        await client.messages.create(
                            model="claude-x",
                            max_tokens=64,
                            system="be brief",
                            messages=messages,
                        )
                    )
                results.append((f"task {i}", text))

            await asyncio.gather(*(one(i) for i in range(TASKS)))

    with sync_client:
        threads = [threading.Thread(target=thread_call, args=(i,)) for i in range(THREADS)]
        for thread in threads:
            thread.start()
        asyncio.run(tasks())
        for thread in threads:
            thread.join(LIMIT_S)
    assert not any(thread.is_alive() for thread in threads)

    assert errors == []
    calls = TASKS + THREADS
    assert len(results) == calls
    # The simulated backend answers with what it was asked: each caller got its own reply.
    assert all(asked in text for asked, text in results), results[:4]
    stats = http_stats(server)
    assert 1 <= stats["inflight_peak"] <= SLOTS
    assert stats["executed_total"] == calls
    gate_stats = gate.statistics()
    assert (gate_stats.calls, gate_stats.calls_ok) == (calls, calls)
    assert gate_stats.attempts / calls <= 1.5, gate_stats
    assert (gate_stats.window.inflight, gate_stats.window.waiting) == (0, 0)


QUOTA_REQUESTS = 200
WINDOW_S = 12.0


def test_a_burst_past_anthropics_input_and_output_limits_is_paced(serve: Any) -> None:
    # Each limit is two thirds of what the burst costs it at the door.
    rng = random.Random(23)
    jobs = [
        ("x" * rng.choice((20, 200, 800)), rng.choice((16, 64, 128))) for _ in range(QUOTA_REQUESTS)
    ]
    # The server's cost rule: the prompt as it reads it ("user: ..."), 4 characters a token;
    # the output charged its max_tokens at the door.
    input_cost = sum(math.ceil(len(f"user: {text}") / 4) for text, _ in jobs)
    output_cost = sum(max_tokens for _, max_tokens in jobs)
    itpm, otpm = math.ceil(input_cost / 1.5), math.ceil(output_cost / 1.5)
    server: ServerProcess = serve(
        "--http-port", "0", "--exec-ms", "20", "--max-inflight", "64",
        "--quota-itpm", str(itpm), "--quota-otpm", str(otpm), "--quota-rpm", "100000",
        "--quota-window-s", str(WINDOW_S),
    )  # fmt: skip

    async def burst() -> tuple[list[Any], float]:
        gate = Gate(name="provider")
        client = yieldgate.anthropic_client(gate, base_url=server.http_url, api_key="unused")

        async def one(text: str, max_tokens: int) -> Any:
            return await client.messages.create(
                model="claude-x",
                max_tokens=max_tokens,
                messages=[{"role": "user", "content": text}],
            )

        start = time.monotonic()
        async with client:
            results = await asyncio.gather(*(one(*job) for job in jobs), return_exceptions=True)
        return results, time.monotonic() - start

    results, makespan = asyncio.run(burst())
    failures = [r for r in results if isinstance(r, BaseException)]
    assert failures == [], failures[:3]
    counters = http_stats(server)
    refused = sum(
        counters[f"quota_refused_{name}_total"]
        for name in ("requests", "tokens", "input_tokens", "output_tokens")
    )
    assert counters["quota_requests_charged_total"] == QUOTA_REQUESTS
    assert counters["quota_too_large_total"] == 0
    assert refused <= 0.02 * QUOTA_REQUESTS, counters
    # The limits bit: the input bucket alone had half its limit more to refill, at its
    # limit per window, so no burst could end sooner than half a window (a lower bound:
    # a busy machine only makes it later).
    assert makespan >= 0.95 * WINDOW_S / 2, makespan
