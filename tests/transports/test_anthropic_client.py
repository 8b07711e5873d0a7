"""``yieldgate.anthropic_client``: anthropic's own client, the Gate's HTTP client, no retries.

When the Gate gives up without a response, the caller catches what anthropic
documents for a connection failure or a timeout, with the Gate's error as
its ``__cause__``, as with openai's client (tests/transports/test_client_errors.py).
"""

from __future__ import annotations

from typing import Any

import anthropic
import anyio
import httpx2
import pytest

import yieldgate
from tests.conftest import stats_when
from yieldgate import (
    DeadlineExceededError,
    Gate,
    GatePolicy,
    RetriesExhaustedError,
    RetryPolicy,
)
from yieldgate.server import ServerProcess

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

MESSAGES: Any = [{"role": "user", "content": "hello"}]


def retrying(attempts: int = 2) -> Gate:
    return Gate(GatePolicy(retry=RetryPolicy(max_attempts=attempts, base_s=0.01)), name="claude")


def test_it_is_anthropics_own_client_with_the_gates_http_client_and_no_retries() -> None:
    gate = Gate(name="anthropic")
    client = yieldgate.anthropic_client(gate, base_url="http://127.0.0.1:1", api_key="k")
    assert type(client) is anthropic.AsyncAnthropic
    assert client.max_retries == 0
    assert isinstance(client._client, httpx2.AsyncClient)
    sync = yieldgate.anthropic_client(gate, sync=True, api_key="k")
    assert type(sync) is anthropic.Anthropic
    assert sync.max_retries == 0
    with pytest.raises(TypeError, match="anthropic_client sets max_retries"):
        yieldgate.anthropic_client(gate, api_key="k", max_retries=2)
    with pytest.raises(TypeError, match="http_client"):
        yieldgate.anthropic_client(gate, api_key="k", http_client=httpx2.AsyncClient())


async def test_no_connection_is_anthropics_connection_error_with_the_gates_reason(
    refused_url: str,
) -> None:
    gate = retrying()
    async with yieldgate.anthropic_client(gate, base_url=refused_url, api_key="x") as client:
        with pytest.raises(anthropic.APIConnectionError) as caught:
            await client.messages.create(model="m", max_tokens=8, messages=MESSAGES)
    assert type(caught.value) is anthropic.APIConnectionError
    gave_up = caught.value.__cause__
    assert isinstance(gave_up, RetriesExhaustedError)
    assert gave_up.attempts == 2
    assert gate.statistics().attempts == 2


async def test_a_client_timeout_is_anthropics_timeout_error_and_bounds_the_call(
    slow_server: ServerProcess,
) -> None:
    gate = retrying(attempts=4)
    client = yieldgate.anthropic_client(
        gate, base_url=slow_server.http_url, api_key="x", timeout=0.5
    )
    async with client:
        with pytest.raises(anthropic.APITimeoutError) as caught:
            await client.messages.create(model="m", max_tokens=8, messages=MESSAGES)
    assert isinstance(caught.value.__cause__, DeadlineExceededError)
    assert gate.statistics().attempts == 1


def test_the_sync_client_catches_the_same(refused_url: str) -> None:
    gate = retrying()
    with (
        yieldgate.anthropic_client(gate, sync=True, base_url=refused_url, api_key="x") as client,
        pytest.raises(anthropic.APIConnectionError) as caught,
    ):
        client.messages.create(model="m", max_tokens=8, messages=MESSAGES)
    assert isinstance(caught.value.__cause__, RetriesExhaustedError)
    assert gate.statistics().attempts == 2


async def test_a_529_the_gate_stops_waiting_on_is_anthropics_own_error(serve: Any) -> None:
    # One slot, held for 30 s by a request sent around the Gate: a gated call is refused
    # with a 529 overloaded_error whose hint (about 30 s) its 1 s cannot wait out.
    server: ServerProcess = serve("--max-inflight", "1", "--exec-ms", "30000", "--http-port", "0")
    body = {"model": "m", "max_tokens": 8, "messages": MESSAGES}

    async with httpx2.AsyncClient(base_url=server.http_url, timeout=60) as plain:

        async def hold() -> None:
            await plain.post("/v1/messages", json=body)

        async def stats() -> dict[str, Any]:
            counters: dict[str, Any] = (await plain.get("/stats")).json()
            return counters

        async with anyio.create_task_group() as tg:
            tg.start_soon(hold)
            await stats_when(stats, lambda counters: counters["inflight"] == 1)
            gate = Gate(name="overloaded")
            client = yieldgate.anthropic_client(
                gate, base_url=server.http_url, api_key="x", timeout=1.0
            )
            async with client:
                with pytest.raises(anthropic.InternalServerError) as caught:
                    await client.messages.create(model="m", max_tokens=8, messages=MESSAGES)
            tg.cancel_scope.cancel()
    assert caught.value.status_code == 529
    assert isinstance(caught.value, anthropic.OverloadedError)
    assert caught.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]
    gave_up = caught.value.response.extensions["yieldgate_error"]
    assert isinstance(gave_up, DeadlineExceededError)
    assert gave_up.last_hint_s is not None
    assert gave_up.last_hint_s > 1.0
    stats = gate.statistics()
    assert stats.calls_ok == 0
    assert stats.window.inflight == 0
