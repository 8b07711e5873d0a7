"""A gated async client made once keeps working when the event loop is replaced.

Scripts call ``asyncio.run`` more than once, and test runners give each test a
new loop: a client whose connection pool belongs to the first loop failed the
second time with ``RuntimeError('Event loop is closed')``. Each test here makes
one client and calls it from two (or three) successive loops, against a real
``yieldgate serve`` process. ``PerLoopTransport`` is also tested alone.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import anthropic
import openai
import pytest
import trio
from huggingface_hub import AsyncInferenceClient

import yieldgate
from yieldgate.server import ServerProcess, spawn
from yieldgate.transports._flavor import detect_flavor
from yieldgate.transports._per_loop import PerLoopTransport

pytestmark = pytest.mark.e2e

ANTHROPICS = detect_flavor(client="anthropic")  # the HTTP library anthropic is built on
MESSAGES = [{"role": "user", "content": "hello there"}]


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with spawn("--max-inflight", "4", "--exec-ms", "5", "--http-port", "0") as proc:
        yield proc


def base(server: ServerProcess) -> str:
    assert server.http_url is not None
    return server.http_url


def twice(call: Callable[[], Awaitable[Any]]) -> list[Any]:
    """``call()`` under two successive ``asyncio.run``: what each returned."""
    return [asyncio.run(call()) for _ in range(2)]


def assert_two_calls_ok(gate: yieldgate.Gate) -> None:
    stats = gate.statistics()
    assert (stats.calls, stats.calls_ok, stats.attempts) == (2, 2, 2)


def test_openai_client_under_two_event_loops(server: ServerProcess) -> None:
    gate = yieldgate.Gate(name="openai-loops")
    client = yieldgate.openai_client(gate, base_url=f"{base(server)}/v1", api_key="k")

    async def call() -> str | None:
        reply = await client.chat.completions.create(model="tiny", messages=MESSAGES)
        return reply.choices[0].message.content

    assert all(twice(call))
    assert_two_calls_ok(gate)


def test_openai_client_streams_under_two_event_loops(server: ServerProcess) -> None:
    gate = yieldgate.Gate(name="openai-stream-loops")
    client = yieldgate.openai_client(gate, base_url=f"{base(server)}/v1", api_key="k")

    async def call() -> str:
        stream = await client.chat.completions.create(model="tiny", messages=MESSAGES, stream=True)
        parts = [chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices]
        return "".join(parts)

    assert all(twice(call))
    assert_two_calls_ok(gate)
    assert gate.statistics().window.inflight == 0


def test_anthropic_client_under_two_event_loops(server: ServerProcess) -> None:
    gate = yieldgate.Gate(name="anthropic-loops")
    client = yieldgate.anthropic_client(gate, base_url=base(server), api_key="k")

    async def call() -> str:
        message = await client.messages.create(model="tiny", max_tokens=16, messages=MESSAGES)
        return str(message.content[0].text)

    assert all(twice(call))
    assert_two_calls_ok(gate)


def test_http_client_under_official_clients_under_two_event_loops(server: ServerProcess) -> None:
    gate = yieldgate.Gate(name="http-client-loops")
    chat = openai.AsyncOpenAI(
        base_url=f"{base(server)}/v1",
        api_key="k",
        http_client=yieldgate.http_client(gate),
        max_retries=0,
    )
    messages = anthropic.AsyncAnthropic(
        base_url=base(server),
        api_key="k",
        http_client=yieldgate.http_client(gate, dialect="anthropic", flavor=ANTHROPICS),
        max_retries=0,
    )

    async def call() -> tuple[Any, Any]:
        reply = await chat.chat.completions.create(model="tiny", messages=MESSAGES)
        message = await messages.messages.create(model="tiny", max_tokens=16, messages=MESSAGES)
        return reply.choices[0].message.content, message.content[0].text

    assert all(all(pair) for pair in twice(call))
    assert gate.statistics().calls_ok == 4


def test_huggingface_client_under_two_event_loops(server: ServerProcess) -> None:
    gate = yieldgate.Gate(name="hf-loops")
    with yieldgate.huggingface_clients(gate):
        client = AsyncInferenceClient(model=f"{base(server)}/models/tiny")

        async def call() -> str:
            return await client.text_generation("once upon a time", max_new_tokens=8)

        assert all(twice(call))
    assert_two_calls_ok(gate)


def test_http_client_under_two_trio_runs_and_asyncio_between(server: ServerProcess) -> None:
    gate = yieldgate.Gate(name="trio-loops")
    client = yieldgate.http_client(gate, base_url=base(server))
    body = {"model": "tiny", "messages": MESSAGES}

    async def call() -> int:
        response = await client.post("/v1/chat/completions", json=body)
        return int(response.status_code)

    statuses = [trio.run(call), trio.run(call), asyncio.run(call()), trio.run(call)]
    assert statuses == [200, 200, 200, 200]
    assert gate.statistics().calls_ok == 4


def test_one_client_from_two_threads_each_with_its_own_loop(server: ServerProcess) -> None:
    gate = yieldgate.Gate(name="thread-loops")
    client = yieldgate.http_client(gate, base_url=base(server))
    body = {"model": "tiny", "messages": MESSAGES}
    both_running = threading.Barrier(2, timeout=30)
    statuses: list[int] = []

    async def calls() -> None:
        statuses.append((await client.post("/v1/chat/completions", json=body)).status_code)
        # Both loops are alive and hold a pool now: neither may drop the other's.
        await asyncio.to_thread(both_running.wait)
        for _ in range(3):
            statuses.append((await client.post("/v1/chat/completions", json=body)).status_code)

    threads = [threading.Thread(target=asyncio.run, args=(calls(),)) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert statuses == [200] * 8


class FakePool:
    def __init__(self, made: list[FakePool]) -> None:
        self.loop = asyncio.get_running_loop()
        self.closed = False
        made.append(self)

    async def handle_async_request(self, request: Any) -> Any:
        assert asyncio.get_running_loop() is self.loop
        return request

    async def aclose(self) -> None:
        assert asyncio.get_running_loop() is self.loop
        self.closed = True


def test_per_loop_transport_builds_one_pool_per_loop_and_drops_ended_ones() -> None:
    made: list[FakePool] = []
    transport = PerLoopTransport(lambda: FakePool(made))

    async def two_requests() -> None:
        assert await transport.handle_async_request("a") == "a"
        assert await transport.handle_async_request("b") == "b"

    asyncio.run(two_requests())
    asyncio.run(two_requests())
    assert len(made) == 2  # one per loop, reused within it
    # The first loop's pool was dropped (its loop closed), not closed on another loop.
    assert [entry[1] for entry in transport._pools] == [made[1]]
    assert not made[0].closed

    async def close() -> None:
        await transport.handle_async_request("c")
        await transport.aclose()

    asyncio.run(close())
    assert made[2].closed
    assert not made[1].closed
    assert transport._pools == ()


def test_per_loop_transport_keeps_the_pool_of_a_loop_that_runs_again() -> None:
    made: list[FakePool] = []
    transport = PerLoopTransport(lambda: FakePool(made))
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(transport.handle_async_request("a"))
        asyncio.run(transport.handle_async_request("b"))  # another loop meanwhile
        loop.run_until_complete(transport.handle_async_request("c"))
    finally:
        loop.close()
    assert len(made) == 2
    assert made[0].loop is loop
