"""A pydantic-ai Agent on its OpenAI provider with the Gate's client, against a real server.

``OpenAIProvider`` (pydantic-ai-slim 2.31.1, ``providers/openai.py``) takes an
``openai_client`` (an ``openai.AsyncOpenAI`` used as given) or an
``http_client`` (then it builds the ``AsyncOpenAI`` itself, with openai's
default of 2 retries, which a test pins): the recipe hands it
``yieldgate.openai_client(gate)``. pydantic-ai maps openai's errors to its own
(``models/openai.py``, ``_map_api_errors``): a status error to
``ModelHTTPError`` (with the status code, body and headers), anything else,
a connection error included, to ``ModelAPIError``; openai's is the
``__cause__``, and the Gate's is its cause or its response's
``yieldgate_error``.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable

import openai
import pytest
from pydantic_ai import Agent
from pydantic_ai.exceptions import ModelAPIError, ModelHTTPError
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

import yieldgate
from tests.compat.burst import CALLS, burst, in_thread
from yieldgate import (
    DeadlineExceededError,
    Gate,
    GatePolicy,
    RetriesExhaustedError,
    RetryPolicy,
    TimeoutPolicy,
)
from yieldgate.server import ServerProcess

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

MODEL = "yieldgate-sim"


def agent(gate: Gate, base_url: str) -> Agent[None, str]:
    """The recipe: the provider on the Gate's openai client (its retries off)."""
    client = yieldgate.openai_client(gate, base_url=base_url, api_key="unused")
    model = OpenAIChatModel(MODEL, provider=OpenAIProvider(openai_client=client))
    return Agent(model)


def run(bot: Agent[None, str], i: int) -> Callable[[], Awaitable[str]]:
    async def call() -> str:
        if i % 2:
            async with bot.run_stream(f"hello {i}") as stream:
                return await stream.get_output()
        return (await bot.run(f"hello {i}")).output

    return call


async def test_agent_runs_and_streams_a_burst_all_succeeds(server: ServerProcess) -> None:
    gate = Gate(name="pydantic-ai")
    bot = agent(gate, f"{server.http_url}/v1")
    seen = await burst(server, [run(bot, i) for i in range(CALLS)])
    seen.assert_all_succeeded()
    assert seen.results == [f"user: hello {i}" for i in range(CALLS)]
    assert gate.statistics().calls_ok == CALLS  # every one went through the Gate


async def test_run_sync_from_threads_one_client_each_one_gate(server: ServerProcess) -> None:
    # run_sync runs each call on the calling thread's event loop, and an async HTTP
    # client's connections belong to the loop that opened them: one client (and
    # Agent) per thread, all on the one Gate, which serves every loop.
    gate = Gate(name="pydantic-ai-sync")
    local = threading.local()

    def one(i: int) -> str:
        if not hasattr(local, "bot"):
            local.bot = agent(gate, f"{server.http_url}/v1")
        output: str = local.bot.run_sync(f"hello {i}").output
        return output

    seen = await burst(server, [in_thread(one, i) for i in range(CALLS)])
    seen.assert_all_succeeded()
    assert seen.results == [f"user: hello {i}" for i in range(CALLS)]
    assert gate.statistics().calls_ok == CALLS


def test_the_http_client_way_leaves_openais_retries_on() -> None:
    gate = Gate(name="pydantic-ai")
    provider = OpenAIProvider(
        base_url="http://127.0.0.1:9/v1", api_key="unused", http_client=yieldgate.http_client(gate)
    )
    assert provider.client.max_retries == 2  # openai's, on top of the Gate's
    client = yieldgate.openai_client(gate, base_url="http://127.0.0.1:9/v1", api_key="unused")
    assert OpenAIProvider(openai_client=client).client.max_retries == 0


async def test_no_connection_is_model_api_error_from_openais(refused_url: str) -> None:
    gate = Gate(GatePolicy(retry=RetryPolicy(max_attempts=2, base_s=0.01)), name="give-up")
    bot = agent(gate, f"{refused_url}/v1")
    with pytest.raises(ModelAPIError) as caught:
        await bot.run("hi")
    assert not isinstance(caught.value, ModelHTTPError)
    connection = caught.value.__cause__
    assert isinstance(connection, openai.APIConnectionError)
    assert isinstance(connection.__cause__, RetriesExhaustedError)
    assert gate.statistics().attempts == 2  # the Gate's, and no openai retries on top


async def test_yielded_to_the_deadline_is_model_http_error_429(
    yielding_server: ServerProcess,
) -> None:
    gate = Gate(GatePolicy(timeout=TimeoutPolicy(total_s=1.0)), name="give-up")
    bot = agent(gate, f"{yielding_server.http_url}/v1")
    with pytest.raises(ModelHTTPError) as caught:
        await bot.run("hi")
    assert caught.value.status_code == 429
    assert caught.value.headers is not None
    assert int(caught.value.headers["retry-after"]) > 1  # the server's hint, passed on
    rate_limited = caught.value.__cause__
    assert isinstance(rate_limited, openai.RateLimitError)
    gave_up = rate_limited.response.extensions["yieldgate_error"]
    assert isinstance(gave_up, DeadlineExceededError)
    assert gate.statistics().attempts == 1
