"""LlamaIndex's ``OpenAI`` LLM on the Gate's HTTP clients, against a real server.

``llama_index.llms.openai.OpenAI`` (llama-index-llms-openai 0.8.3, ``base.py``)
builds its ``openai.OpenAI`` and ``openai.AsyncOpenAI`` on the ``http_client``
and ``async_http_client`` it is given. Its ``max_retries`` (default 3) is used
twice: as openai's own, and by a tenacity decorator of LlamaIndex's around
each call (exponential waits of 1 to 20 s); ``max_retries=0`` turns both off,
and a test pins the default. It raises openai's exceptions as they are. Its
``model`` must be a name LlamaIndex knows (it looks the context window up):
the reference server answers under any name, so these use ``gpt-4o-mini``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import openai
import pytest
from llama_index.core.llms import ChatMessage
from llama_index.llms.openai import OpenAI

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

MODEL = "gpt-4o-mini"


def llama_openai(gate: Gate, api_base: str) -> OpenAI:
    """The recipe: both of the Gate's clients, and both retry loops off."""
    return OpenAI(
        model=MODEL,
        api_base=api_base,
        api_key="unused",
        http_client=yieldgate.http_client(gate, sync=True),
        async_http_client=yieldgate.http_client(gate),
        max_retries=0,
    )


def hello(i: int) -> list[ChatMessage]:
    return [ChatMessage(role="user", content=f"hello {i}")]


def ask(llm: OpenAI, i: int) -> Callable[[], Awaitable[str]]:
    async def call() -> str:
        if i % 2:
            return "".join([r.delta or "" async for r in await llm.astream_chat(hello(i))])
        return str((await llm.achat(hello(i))).message.content)

    return call


def ask_sync(llm: OpenAI, i: int) -> str:
    if i % 3 == 2:
        return llm.complete(f"hello {i}").text
    if i % 3 == 1:
        return "".join(r.delta or "" for r in llm.stream_chat(hello(i)))
    return str(llm.chat(hello(i)).message.content)


async def test_achat_and_astream_chat_a_burst_all_succeeds(server: ServerProcess) -> None:
    gate = Gate(name="llamaindex")
    llm = llama_openai(gate, f"{server.http_url}/v1")
    seen = await burst(server, [ask(llm, i) for i in range(CALLS)])
    seen.assert_all_succeeded()
    assert seen.results == [f"user: hello {i}" for i in range(CALLS)]
    assert gate.statistics().calls_ok == CALLS  # every one went through the Gate


async def test_chat_stream_chat_and_complete_from_threads_a_burst_all_succeeds(
    server: ServerProcess,
) -> None:
    gate = Gate(name="llamaindex-sync")
    llm = llama_openai(gate, f"{server.http_url}/v1")
    seen = await burst(server, [in_thread(ask_sync, llm, i) for i in range(CALLS)])
    seen.assert_all_succeeded()
    assert seen.results == [f"user: hello {i}" for i in range(CALLS)]
    assert gate.statistics().calls_ok == CALLS


def test_the_clients_are_the_gates_and_its_retries_are_on_unless_zero() -> None:
    gate = Gate(name="llamaindex")
    llm = llama_openai(gate, "http://127.0.0.1:9/v1")
    assert llm._get_client().max_retries == 0
    assert llm._get_aclient().max_retries == 0
    assert llm._get_client()._client is llm._http_client
    assert llm._get_aclient()._client is llm._async_http_client
    default = OpenAI(
        model=MODEL,
        api_base="http://127.0.0.1:9/v1",
        api_key="unused",
        async_http_client=yieldgate.http_client(gate),
    )
    assert default.max_retries == 3  # LlamaIndex's own retry loop, on top of the Gate's
    assert default._get_aclient().max_retries == 3  # and openai's, under it


async def test_no_connection_is_openais_connection_error_caused_by_the_gate(
    refused_url: str,
) -> None:
    gate = Gate(GatePolicy(retry=RetryPolicy(max_attempts=2, base_s=0.01)), name="give-up")
    llm = llama_openai(gate, f"{refused_url}/v1")
    with pytest.raises(openai.APIConnectionError) as caught:
        await llm.achat(hello(0))
    assert type(caught.value) is openai.APIConnectionError  # openai's own, not wrapped
    assert isinstance(caught.value.__cause__, RetriesExhaustedError)
    assert gate.statistics().attempts == 2  # the Gate's, and no other retries on top


def test_yielded_to_the_deadline_is_openais_rate_limit_error(
    yielding_server: ServerProcess,
) -> None:
    gate = Gate(GatePolicy(timeout=TimeoutPolicy(total_s=1.0)), name="give-up")
    llm = llama_openai(gate, f"{yielding_server.http_url}/v1")
    with pytest.raises(openai.RateLimitError) as caught:
        llm.chat(hello(0))
    assert type(caught.value) is openai.RateLimitError
    gave_up = caught.value.response.extensions["yieldgate_error"]
    assert isinstance(gave_up, DeadlineExceededError)
    assert gate.statistics().attempts == 1
    assert gate.statistics().window.inflight == 0
