"""LiteLLM through the Gate's transport, against a real server.

LiteLLM's OpenAI route (``model="openai/..."``) sends through an ``openai``
2.x client, and takes the HTTP client two supported ways (read in
``litellm/llms/openai/openai.py`` and ``common_utils.py``, 1.106.2):
``acompletion(client=...)``, an ``openai.AsyncOpenAI`` used as given, and the
process-wide ``litellm.aclient_session``, the ``httpx.AsyncClient`` it builds
its own clients on (for ``completion``: an ``openai.OpenAI``, and
``litellm.client_session``). All carry ``yieldgate``'s. One catch, pinned here: a
client handed in has its ``max_retries`` set to LiteLLM's (2, its
``DEFAULT_MAX_RETRIES``) unless the call passes ``max_retries=0``.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import litellm
import openai
import pytest

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

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.e2e,
    # Raised by LiteLLM's own types on import of its response models; not ours.
    pytest.mark.filterwarnings("ignore:Item .* is using the `ReadOnly` qualifier:UserWarning"),
]

MODEL = "openai/yieldgate-sim"


def completion(i: int, **kwargs: Any) -> Callable[[], Awaitable[str]]:
    async def call() -> str:
        messages = [{"role": "user", "content": f"hello {i}"}]
        if i % 2:
            stream: Any = await litellm.acompletion(
                model=MODEL, messages=messages, stream=True, max_retries=0, **kwargs
            )
            return "".join([c.choices[0].delta.content or "" async for c in stream])
        reply: Any = await litellm.acompletion(
            model=MODEL, messages=messages, max_retries=0, **kwargs
        )
        return str(reply.choices[0].message.content)

    return call


async def test_acompletion_with_the_gates_openai_client_a_burst_all_succeeds(
    server: ServerProcess,
) -> None:
    gate = Gate(name="litellm")
    base = f"{server.http_url}/v1"
    async with yieldgate.openai_client(gate, base_url=base, api_key="unused") as client:
        calls = [
            completion(i, api_base=base, api_key="unused", client=client) for i in range(CALLS)
        ]
        seen = await burst(server, calls)
    seen.assert_all_succeeded()
    assert seen.results == [f"user: hello {i}" for i in range(CALLS)]
    assert gate.statistics().calls_ok == CALLS  # every one went through the Gate


@pytest.fixture
def session_gate(monkeypatch: pytest.MonkeyPatch) -> Gate:
    """``litellm.aclient_session`` is global: set for one test, put back after it."""
    gate = Gate(name="litellm-session")
    monkeypatch.setattr(litellm, "aclient_session", yieldgate.http_client(gate))
    return gate


async def test_aclient_session_a_burst_all_succeeds(
    server: ServerProcess, session_gate: Gate
) -> None:
    assert type(litellm.aclient_session) is httpx.AsyncClient
    base = f"{server.http_url}/v1"
    # An api_key of its own: LiteLLM caches the clients it builds by their parameters.
    calls = [completion(i, api_base=base, api_key="session") for i in range(CALLS)]
    seen = await burst(server, calls)
    seen.assert_all_succeeded()
    assert session_gate.statistics().calls_ok == CALLS


async def test_litellm_turns_a_clients_retries_back_on_unless_the_call_says_zero(
    server: ServerProcess,
) -> None:
    base = f"{server.http_url}/v1"
    client = yieldgate.openai_client(Gate(name="litellm"), base_url=base, api_key="unused")
    async with client:
        hello = [{"role": "user", "content": "hi"}]
        await litellm.acompletion(model=MODEL, messages=hello, api_base=base, client=client)
        assert client.max_retries == 2  # LiteLLM's default, on the Gate's client
        await litellm.acompletion(
            model=MODEL, messages=hello, api_base=base, client=client, max_retries=0
        )
        assert client.max_retries == 0


async def test_a_give_up_is_litellms_error_with_openais_and_the_gates_under_it(
    refused_url: str,
) -> None:
    gate = Gate(GatePolicy(retry=RetryPolicy(max_attempts=2, base_s=0.01)), name="litellm")
    base = f"{refused_url}/v1"
    async with yieldgate.openai_client(gate, base_url=base, api_key="x") as client:
        with pytest.raises(openai.APIError) as caught:
            await litellm.acompletion(
                model=MODEL,
                messages=[{"role": "user", "content": "hi"}],
                api_base=base,
                client=client,
                max_retries=0,
            )
    # LiteLLM maps openai's connection error to its own InternalServerError (an
    # openai.APIStatusError); openai's is in its chain, with the Gate's as its cause.
    assert isinstance(caught.value, litellm.InternalServerError)
    connection = next(e for e in chain(caught.value) if isinstance(e, openai.APIConnectionError))
    assert isinstance(connection.__cause__, RetriesExhaustedError)
    assert gate.statistics().attempts == 2  # the Gate's, and no openai retries on top


def completion_sync(base: str, i: int, **kwargs: Any) -> str:
    messages = [{"role": "user", "content": f"hello {i}"}]
    common: dict[str, Any] = {"api_base": base, "max_retries": 0, **kwargs}
    if i % 2:
        stream: Any = litellm.completion(model=MODEL, messages=messages, stream=True, **common)
        return "".join(c.choices[0].delta.content or "" for c in stream)
    reply: Any = litellm.completion(model=MODEL, messages=messages, **common)
    return str(reply.choices[0].message.content)


async def test_sync_completion_from_threads_a_burst_all_succeeds(server: ServerProcess) -> None:
    gate = Gate(name="litellm-sync")
    base = f"{server.http_url}/v1"
    with yieldgate.openai_client(gate, sync=True, base_url=base, api_key="unused") as client:
        gated = functools.partial(completion_sync, client=client)
        seen = await burst(server, [in_thread(gated, base, i) for i in range(CALLS)])
    seen.assert_all_succeeded()
    assert seen.results == [f"user: hello {i}" for i in range(CALLS)]
    assert gate.statistics().calls_ok == CALLS


async def test_client_session_from_threads_a_burst_all_succeeds(
    server: ServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = Gate(name="litellm-sync-session")
    monkeypatch.setattr(litellm, "client_session", yieldgate.http_client(gate, sync=True))
    base = f"{server.http_url}/v1"
    # An api_key of its own: LiteLLM caches the clients it builds by their parameters.
    session = functools.partial(completion_sync, api_key="sync-session")
    seen = await burst(server, [in_thread(session, base, i) for i in range(CALLS)])
    seen.assert_all_succeeded()
    assert seen.results == [f"user: hello {i}" for i in range(CALLS)]
    assert gate.statistics().calls_ok == CALLS


def test_yielded_to_the_deadline_is_litellms_rate_limit_error(
    yielding_server: ServerProcess,
) -> None:
    gate = Gate(GatePolicy(timeout=TimeoutPolicy(total_s=1.0)), name="give-up")
    base = f"{yielding_server.http_url}/v1"
    client = yieldgate.openai_client(gate, sync=True, base_url=base, api_key="x")
    with client, pytest.raises(litellm.RateLimitError) as caught:
        completion_sync(base, 0, client=client)
    # LiteLLM's RateLimitError is an openai.RateLimitError; openai's own is under it,
    # its response carrying the Gate's error.
    assert isinstance(caught.value, openai.RateLimitError)
    sdk = next(e for e in chain(caught.value) if type(e) is openai.RateLimitError)
    assert isinstance(sdk.response.extensions["yieldgate_error"], DeadlineExceededError)
    assert gate.statistics().attempts == 1
