"""openai 2.x, the httpx line, unmodified, on ``yieldgate.http_client``, against a real server.

The main env has openai 3.x (httpx2); this is the line LiteLLM and much code in
use still pin. The Gate's client must be an ``httpx`` one (detected, not named),
a burst must all succeed within the server's slots, and when the Gate gives up
without a response the ``except`` clauses openai documents must catch it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anyio
import httpx
import openai
import pytest

import yieldgate
from tests.compat.burst import CALLS, burst
from yieldgate import DeadlineExceededError, Gate, GatePolicy, RetriesExhaustedError, RetryPolicy
from yieldgate.server import ServerProcess

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

MODEL = "yieldgate-sim"
HELLO: Any = [{"role": "user", "content": "hello"}]


def test_the_installed_line_is_2x_and_the_gates_client_is_httpx() -> None:
    assert openai.__version__.startswith("2.")
    gate = Gate(name="flavor")
    assert type(yieldgate.http_client(gate)) is httpx.AsyncClient
    assert type(yieldgate.http_client(gate, sync=True)) is httpx.Client
    client = yieldgate.openai_client(gate, api_key="k")
    assert type(client) is openai.AsyncOpenAI
    assert type(client._client) is httpx.AsyncClient  # the Gate's, handed to openai
    assert client.max_retries == 0


def chat(client: openai.AsyncOpenAI, i: int) -> Callable[[], Awaitable[str]]:
    async def call() -> str:
        messages: Any = [{"role": "user", "content": f"hello {i}"}]
        if i % 2:
            stream = await client.chat.completions.create(
                model=MODEL, messages=messages, stream=True
            )
            return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        reply = await client.chat.completions.create(model=MODEL, messages=messages)
        return reply.choices[0].message.content or ""

    return call


async def test_async_openai_on_http_client_a_burst_all_succeeds(server: ServerProcess) -> None:
    gate = Gate(name="openai2")
    client = openai.AsyncOpenAI(
        base_url=f"{server.http_url}/v1",
        api_key="unused",
        http_client=yieldgate.http_client(gate),
        max_retries=0,
    )
    async with client:
        seen = await burst(server, [chat(client, i) for i in range(CALLS)])
    seen.assert_all_succeeded()
    assert seen.results == [f"user: hello {i}" for i in range(CALLS)]
    assert gate.statistics().calls_ok == CALLS


async def test_openai_client_a_burst_all_succeeds(server: ServerProcess) -> None:
    gate = Gate(name="openai2")
    async with yieldgate.openai_client(
        gate, base_url=f"{server.http_url}/v1", api_key="unused"
    ) as client:
        seen = await burst(server, [chat(client, i) for i in range(CALLS)])
    seen.assert_all_succeeded()
    assert gate.statistics().calls_ok == CALLS


def test_sync_openai_from_threads_a_burst_all_succeeds(server: ServerProcess) -> None:
    gate = Gate(name="openai2-sync")
    client = yieldgate.openai_client(
        gate, sync=True, base_url=f"{server.http_url}/v1", api_key="unused"
    )
    assert type(client) is openai.OpenAI

    def one(i: int) -> str:
        reply = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"hello {i}"}]
        )
        return reply.choices[0].message.content or ""

    with client, ThreadPoolExecutor(max_workers=32) as pool:
        results = list(pool.map(one, range(CALLS)))
    assert results == [f"user: hello {i}" for i in range(CALLS)]
    assert gate.statistics().calls_ok == CALLS
    assert gate.statistics().window.inflight == 0


def retrying(attempts: int) -> Gate:
    return Gate(GatePolicy(retry=RetryPolicy(max_attempts=attempts, base_s=0.01)), name="give-up")


async def test_no_connection_is_api_connection_error_caused_by_the_gate(refused_url: str) -> None:
    gate = retrying(attempts=2)
    async with yieldgate.openai_client(gate, base_url=f"{refused_url}/v1", api_key="x") as client:
        with pytest.raises(openai.APIConnectionError) as caught:
            await client.chat.completions.create(model=MODEL, messages=HELLO)
    gave_up = caught.value.__cause__
    assert isinstance(gave_up, RetriesExhaustedError)
    assert isinstance(gave_up, httpx.TransportError)  # httpx's, not httpx2's
    assert gave_up.attempts == 2


async def test_a_timeout_is_api_timeout_error_caused_by_the_gate(
    slow_server: ServerProcess,
) -> None:
    gate = retrying(attempts=4)
    client = yieldgate.openai_client(
        gate, base_url=f"{slow_server.http_url}/v1", api_key="x", timeout=0.5
    )
    with anyio.fail_after(10):
        async with client:
            with pytest.raises(openai.APITimeoutError) as caught:
                await client.chat.completions.create(model=MODEL, messages=HELLO)
    deadline = caught.value.__cause__
    assert isinstance(deadline, DeadlineExceededError)
    assert isinstance(deadline, httpx.TimeoutException)
    assert gate.statistics().attempts == 1  # the 0.5 s bounds the call, not each attempt


def test_the_sync_client_catches_the_same(refused_url: str, slow_server: ServerProcess) -> None:
    refused = yieldgate.openai_client(
        retrying(attempts=2), sync=True, base_url=f"{refused_url}/v1", api_key="x"
    )
    with refused, pytest.raises(openai.APIConnectionError) as caught:
        refused.chat.completions.create(model=MODEL, messages=HELLO)
    assert isinstance(caught.value.__cause__, RetriesExhaustedError)

    slow = yieldgate.openai_client(
        retrying(attempts=4),
        sync=True,
        base_url=f"{slow_server.http_url}/v1",
        api_key="x",
        timeout=0.5,
    )
    with slow, pytest.raises(openai.APITimeoutError) as timed_out:
        slow.chat.completions.create(model=MODEL, messages=HELLO)
    assert isinstance(timed_out.value.__cause__, DeadlineExceededError)
