"""LangChain's ``ChatOpenAI`` on the Gate's HTTP clients, against a real server.

``ChatOpenAI`` (langchain-openai 1.7.4, ``chat_models/base.py``) builds an
``openai.OpenAI`` for ``invoke``/``stream`` and an ``openai.AsyncOpenAI`` for
``ainvoke``/``astream``, on the ``http_client`` and ``http_async_client`` it is
given. Its ``max_retries`` defaults to ``None``, which leaves openai's own (2):
the recipe passes ``max_retries=0``, and a test pins the default. When the Gate
gives up, ``ChatOpenAI`` raises openai's error as a subclass of both openai's
class and langchain-core's (``OpenAIConnectionError`` is an
``openai.APIConnectionError`` and a ``ModelConnectionError``), raised from
openai's, whose cause is the Gate's error.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import openai
import pytest
from langchain_core.exceptions import ModelConnectionError, ModelRateLimitError
from langchain_openai import ChatOpenAI

import yieldgate
from tests.compat.burst import CALLS, burst, chain, in_thread
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


def chat_openai(gate: Gate, base_url: str) -> ChatOpenAI:
    """The recipe: both of the Gate's clients, and openai's retries off."""
    return ChatOpenAI(
        model=MODEL,
        base_url=base_url,
        api_key="unused",
        http_client=yieldgate.http_client(gate, sync=True),
        http_async_client=yieldgate.http_client(gate),
        max_retries=0,
    )


def text(content: Any) -> str:
    assert isinstance(content, str)
    return content


def ask(llm: ChatOpenAI, i: int) -> Callable[[], Awaitable[str]]:
    async def call() -> str:
        prompt = f"hello {i}"
        if i % 2:
            return "".join([text(chunk.content) async for chunk in llm.astream(prompt)])
        return text((await llm.ainvoke(prompt)).content)

    return call


def ask_sync(llm: ChatOpenAI, i: int) -> str:
    prompt = f"hello {i}"
    if i % 2:
        return "".join(text(chunk.content) for chunk in llm.stream(prompt))
    return text(llm.invoke(prompt).content)


async def test_ainvoke_and_astream_a_burst_all_succeeds(server: ServerProcess) -> None:
    gate = Gate(name="langchain-openai")
    llm = chat_openai(gate, f"{server.http_url}/v1")
    seen = await burst(server, [ask(llm, i) for i in range(CALLS)])
    seen.assert_all_succeeded()
    assert seen.results == [f"user: hello {i}" for i in range(CALLS)]
    assert gate.statistics().calls_ok == CALLS  # every one went through the Gate


async def test_invoke_and_stream_from_threads_a_burst_all_succeeds(
    server: ServerProcess,
) -> None:
    gate = Gate(name="langchain-openai-sync")
    llm = chat_openai(gate, f"{server.http_url}/v1")
    seen = await burst(server, [in_thread(ask_sync, llm, i) for i in range(CALLS)])
    seen.assert_all_succeeded()
    assert seen.results == [f"user: hello {i}" for i in range(CALLS)]
    assert gate.statistics().calls_ok == CALLS


def test_the_clients_are_the_gates_and_openais_retries_stay_on_unless_zero() -> None:
    gate = Gate(name="langchain-openai")
    llm = chat_openai(gate, "http://127.0.0.1:9/v1")
    assert llm.root_client.max_retries == 0
    assert llm.root_async_client.max_retries == 0
    assert llm.root_client._client is llm.http_client
    assert llm.root_async_client._client is llm.http_async_client
    default = ChatOpenAI(
        model=MODEL,
        base_url="http://127.0.0.1:9/v1",
        api_key="unused",
        http_async_client=yieldgate.http_client(gate),
    )
    assert default.root_async_client.max_retries == 2  # openai's, on top of the Gate's


async def test_no_connection_is_openais_connection_error_caused_by_the_gate(
    refused_url: str,
) -> None:
    gate = Gate(GatePolicy(retry=RetryPolicy(max_attempts=2, base_s=0.01)), name="give-up")
    llm = chat_openai(gate, f"{refused_url}/v1")
    with pytest.raises(openai.APIConnectionError) as caught:
        await llm.ainvoke("hi")
    assert isinstance(caught.value, ModelConnectionError)  # langchain-core's class too
    gave_up = next(e.__cause__ for e in chain(caught.value) if type(e) is openai.APIConnectionError)
    assert isinstance(gave_up, RetriesExhaustedError)
    assert gave_up.attempts == 2
    assert gate.statistics().attempts == 2  # the Gate's, and no openai retries on top


def test_yielded_to_the_deadline_is_openais_rate_limit_error(
    yielding_server: ServerProcess,
) -> None:
    gate = Gate(GatePolicy(timeout=TimeoutPolicy(total_s=1.0)), name="give-up")
    llm = chat_openai(gate, f"{yielding_server.http_url}/v1")
    with pytest.raises(openai.RateLimitError) as caught:
        llm.invoke("hi")
    assert isinstance(caught.value, ModelRateLimitError)
    assert caught.value.status_code == 429
    gave_up = caught.value.response.extensions["yieldgate_error"]
    assert isinstance(gave_up, DeadlineExceededError)
    assert gate.statistics().window.inflight == 0
