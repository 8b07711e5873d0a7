"""LangChain's ``ChatAnthropic`` on the Gate's anthropic clients, against a real server.

``ChatAnthropic`` (langchain-anthropic 1.7.10, ``chat_models.py``) takes no HTTP
client: it builds its ``anthropic.Anthropic`` and ``anthropic.AsyncAnthropic``
in two cached properties, ``_client`` and ``_async_client``, from
``_client_params`` and an HTTP client of its own. The recipe's subclass builds
them with ``yieldgate.anthropic_client`` from the same parameters, less
``max_retries`` (anthropic's own retries stay off). Those three names are
private: these tests are what says they still hold for a new release, and one
fails when ``ChatAnthropic`` grows a public way in. When the Gate gives up,
``ChatAnthropic`` raises anthropic's error as its own subclass of it and of
langchain-core's (``AnthropicConnectionError``, ``AnthropicOverloadedError``).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from functools import cached_property
from pathlib import Path
from typing import Any

import anthropic
import pytest
from langchain_anthropic import ChatAnthropic
from langchain_core.exceptions import ModelAPIError, ModelConnectionError
from pydantic import Field

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

MODEL = "claude-sonnet-4-6"
ROOT = Path(__file__).resolve().parents[2]


# docs/recipes/frameworks.md's, word for word (a test checks).
class GatedChatAnthropic(ChatAnthropic):
    """ChatAnthropic whose requests go through a Gate."""

    gate: yieldgate.Gate = Field(exclude=True)
    max_retries: int = 0  # not used: the clients below have anthropic's retries off

    def _gated(self, sync: bool) -> Any:
        params = dict(self._client_params)  # api_key, base_url, default_headers, timeout
        del params["max_retries"]  # anthropic_client turns anthropic's own retries off
        if params.get("timeout") is None:
            # Not set on ChatAnthropic: the Gate's TimeoutPolicy bounds each call. A number
            # set there goes on, as anthropic_client's timeout: the call's total, retries
            # and waits included.
            params.pop("timeout", None)
        return yieldgate.anthropic_client(self.gate, sync=sync, **params)

    @cached_property
    def _client(self) -> anthropic.Anthropic:
        return self._gated(sync=True)

    @cached_property
    def _async_client(self) -> anthropic.AsyncAnthropic:
        return self._gated(sync=False)


def chat_anthropic(gate: Gate, base_url: str, **kwargs: Any) -> GatedChatAnthropic:
    return GatedChatAnthropic(gate=gate, model=MODEL, base_url=base_url, api_key="unused", **kwargs)


def text(content: Any) -> str:
    assert isinstance(content, str)
    return content


def ask(llm: ChatAnthropic, i: int) -> Callable[[], Awaitable[str]]:
    async def call() -> str:
        prompt = f"hello {i}"
        if i % 2:
            return "".join([text(chunk.content) async for chunk in llm.astream(prompt)])
        return text((await llm.ainvoke(prompt)).content)

    return call


def ask_sync(llm: ChatAnthropic, i: int) -> str:
    prompt = f"hello {i}"
    if i % 2:
        return "".join(text(chunk.content) for chunk in llm.stream(prompt))
    return text(llm.invoke(prompt).content)


async def test_ainvoke_and_astream_a_burst_all_succeeds(server: ServerProcess) -> None:
    gate = Gate(name="langchain-anthropic")
    llm = chat_anthropic(gate, server.http_url or "")
    seen = await burst(server, [ask(llm, i) for i in range(CALLS)])
    seen.assert_all_succeeded()
    assert seen.results == [f"user: hello {i}" for i in range(CALLS)]
    assert gate.statistics().calls_ok == CALLS  # every one went through the Gate


async def test_invoke_and_stream_from_threads_a_burst_all_succeeds(
    server: ServerProcess,
) -> None:
    gate = Gate(name="langchain-anthropic-sync")
    llm = chat_anthropic(gate, server.http_url or "")
    seen = await burst(server, [in_thread(ask_sync, llm, i) for i in range(CALLS)])
    seen.assert_all_succeeded()
    assert seen.results == [f"user: hello {i}" for i in range(CALLS)]
    assert gate.statistics().calls_ok == CALLS


def test_the_recipe_is_this_subclass() -> None:
    recipe = (ROOT / "docs" / "recipes" / "frameworks.md").read_text(encoding="utf-8")
    assert inspect.getsource(GatedChatAnthropic) in recipe


def test_the_subclass_still_reaches_the_clients_chat_anthropic_uses() -> None:
    assert "http_client" not in ChatAnthropic.model_fields, (
        "ChatAnthropic takes an HTTP client now: the recipe can pass the Gate's instead"
    )
    llm = chat_anthropic(Gate(name="langchain-anthropic"), "http://127.0.0.1:9")
    for client in (llm._client, llm._async_client):
        assert client.max_retries == 0
        assert str(client.base_url).rstrip("/") == "http://127.0.0.1:9"
        assert client.api_key == "unused"
        assert "langchain-anthropic" in client.default_headers["User-Agent"]
    assert "gate" not in llm.model_dump()  # not serialised with the model's settings


async def test_no_connection_is_anthropics_connection_error_caused_by_the_gate(
    refused_url: str,
) -> None:
    gate = Gate(GatePolicy(retry=RetryPolicy(max_attempts=2, base_s=0.01)), name="give-up")
    llm = chat_anthropic(gate, refused_url)
    with pytest.raises(anthropic.APIConnectionError) as caught:
        await llm.ainvoke("hi")
    assert isinstance(caught.value, ModelConnectionError)  # langchain-core's class too
    sdk = next(e for e in chain(caught.value) if type(e) is anthropic.APIConnectionError)
    assert isinstance(sdk.__cause__, RetriesExhaustedError)
    assert gate.statistics().attempts == 2  # the Gate's, and no anthropic retries on top


@pytest.mark.parametrize(
    ("policy", "timeout"),
    [(GatePolicy(timeout=TimeoutPolicy(total_s=1.0)), None), (GatePolicy(), 1.0)],
    ids=["the-gates-policy", "chat-anthropics-timeout"],
)
def test_yielded_to_the_deadline_is_anthropics_overloaded_error(
    yielding_server: ServerProcess, policy: GatePolicy, timeout: float | None
) -> None:
    # The server hints minutes ahead: a call allowed 1 s gives up at the first yield.
    gate = Gate(policy, name="give-up")
    llm = chat_anthropic(gate, yielding_server.http_url or "", timeout=timeout)
    with pytest.raises(anthropic.OverloadedError) as caught:
        llm.invoke("hi")
    assert isinstance(caught.value, ModelAPIError)  # langchain-core's class too
    assert caught.value.status_code == 529
    gave_up = caught.value.response.extensions["yieldgate_error"]
    assert isinstance(gave_up, DeadlineExceededError)
    assert gate.statistics().attempts == 1
    assert gate.statistics().window.inflight == 0
