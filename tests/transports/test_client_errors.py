"""What the official clients raise when the Gate gives up without a response.

The transport raises an error that is both the HTTP library's (a transport
error, or a timeout for a deadline) and the Gate's, so the ``except`` clause
each client's documentation tells users to write catches it, the Gate's
reason (attempts, last hint) is one ``__cause__`` away, and
``except yieldgate.CircuitOpenError`` still works. And a timeout the client
puts on a request bounds the whole call: it is not multiplied by retries.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import anthropic
import httpx2
import openai
import pytest
from huggingface_hub import AsyncInferenceClient, InferenceClient
from huggingface_hub.errors import InferenceTimeoutError

import yieldgate
from yieldgate import (
    BreakerPolicy,
    CircuitOpenError,
    DeadlineExceededError,
    Gate,
    GatePolicy,
    GaveUpError,
    RetriesExhaustedError,
    RetryPolicy,
)
from yieldgate.server import ServerProcess

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

MESSAGES: list[dict[str, str]] = [{"role": "user", "content": "hello"}]
HTTP_MD = Path(__file__).resolve().parents[2] / "docs" / "http.md"
# The library's own classes, for a cell that says "the library's `TransportError`".
LIBRARY = "httpx2"


def documented() -> dict[str, dict[str, type[BaseException]]]:
    """docs/http.md's table of what each client raises when the Gate gives up without a
    response: per client, the class for "a deadline" and for "the rest"."""
    text = HTTP_MD.read_text(encoding="utf-8").split("## When the Gate gives up", 1)[1]
    rows = [line for line in text.split("\n## ", 1)[0].splitlines() if line.strip().startswith("|")]
    header = [c.strip() for c in rows[0].strip().strip("|").split("|")]
    assert header == ["client", "catch", "`__cause__`"]
    table: dict[str, dict[str, type[BaseException]]] = {}
    for line in rows[2:]:
        client, catch, _cause = (c.strip() for c in line.strip().strip("|").split("|"))
        found = {}
        for name, case in re.findall(r"`([\w.]+)` \((a deadline|the rest)\)", catch):
            module, _, attr = name.rpartition(".")
            found[case] = getattr(importlib.import_module(module or LIBRARY), attr)
        table[client.split(" ", 1)[0]] = found
    return table


DOCUMENTED = documented()


def retrying(attempts: int = 2) -> Gate:
    policy = GatePolicy(retry=RetryPolicy(max_attempts=attempts, base_s=0.01))
    return Gate(policy, name="errors")


async def test_no_connection_is_openais_connection_error_with_the_gates_reason(
    refused_url: str,
) -> None:
    gate = retrying()
    client = yieldgate.openai_client(gate, base_url=f"{refused_url}/v1", api_key="x")
    async with client:
        with pytest.raises(DOCUMENTED["openai"]["the rest"]) as caught:
            await client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    assert type(caught.value) is openai.APIConnectionError
    gave_up = caught.value.__cause__
    assert isinstance(gave_up, RetriesExhaustedError)
    assert isinstance(gave_up, httpx2.TransportError)
    assert gave_up.attempts == 2
    assert gate.statistics().attempts == 2


async def test_an_open_circuit_is_still_caught_as_the_gates_error(refused_url: str) -> None:
    policy = GatePolicy(
        retry=RetryPolicy(max_attempts=1), breaker=BreakerPolicy(fail_max=1, reset_timeout_s=60)
    )
    gate = Gate(policy, name="circuit")
    async with yieldgate.http_client(gate, base_url=refused_url) as client:
        with pytest.raises(httpx2.TransportError) as first:
            await client.get("/health")  # the failure that opens the breaker
        assert isinstance(first.value, RetriesExhaustedError)
        assert isinstance(first.value.__cause__, httpx2.ConnectError)
        with pytest.raises(CircuitOpenError) as caught:
            await client.get("/health")
    assert isinstance(caught.value, httpx2.TransportError)
    assert caught.value.request.url.path == "/health"
    assert caught.value.retry_after_s is not None


async def test_a_client_timeout_bounds_the_whole_call_not_each_attempt(
    slow_server: ServerProcess,
) -> None:
    gate = retrying(attempts=4)
    client = yieldgate.openai_client(
        gate, base_url=f"{slow_server.http_url}/v1", api_key="x", timeout=0.5
    )
    async with client:
        with pytest.raises(DOCUMENTED["openai"]["a deadline"]) as caught:
            await client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    assert type(caught.value) is openai.APITimeoutError
    deadline = caught.value.__cause__
    assert isinstance(deadline, DeadlineExceededError)
    assert isinstance(deadline, GaveUpError)
    assert isinstance(deadline, TimeoutError)
    # One attempt, cut at the request's 0.5 s: no retries multiplying it.
    assert gate.statistics().attempts == 1


def test_the_sync_clients_catch_the_same(refused_url: str, slow_server: ServerProcess) -> None:
    gate = retrying()
    url = f"{refused_url}/v1"
    with (
        yieldgate.openai_client(gate, sync=True, base_url=url, api_key="x") as c,
        pytest.raises(openai.APIConnectionError) as caught,
    ):
        c.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    assert isinstance(caught.value.__cause__, RetriesExhaustedError)

    slow = retrying(attempts=4)
    with yieldgate.huggingface_clients(slow):
        client = InferenceClient(model=f"{slow_server.http_url}/models/tiny", timeout=0.5)
        with pytest.raises(DOCUMENTED["huggingface_hub"]["a deadline"]) as timed_out:
            client.text_generation("hello", max_new_tokens=4)
    assert isinstance(timed_out.value.__cause__, DeadlineExceededError)
    assert slow.statistics().attempts == 1

    with yieldgate.huggingface_clients(retrying()):
        refused = InferenceClient(model=f"{refused_url}/models/tiny")
        with pytest.raises(DOCUMENTED["huggingface_hub"]["the rest"]) as no_connection:
            refused.text_generation("hello", max_new_tokens=4)
    assert isinstance(no_connection.value, RetriesExhaustedError)
    assert isinstance(no_connection.value.__cause__, httpx2.ConnectError)


def test_the_docs_table_names_a_class_for_each_case() -> None:
    assert DOCUMENTED["openai"] == {
        "a deadline": openai.APITimeoutError,
        "the rest": openai.APIConnectionError,
    }
    assert DOCUMENTED["anthropic"] == {
        "a deadline": anthropic.APITimeoutError,
        "the rest": anthropic.APIConnectionError,
    }
    assert DOCUMENTED["huggingface_hub"] == {
        "a deadline": InferenceTimeoutError,
        "the rest": httpx2.TransportError,
    }


async def test_huggingface_hub_async_raises_its_timeout_error(slow_server: ServerProcess) -> None:
    gate = retrying(attempts=4)
    with yieldgate.huggingface_clients(gate):
        async with AsyncInferenceClient(
            model=f"{slow_server.http_url}/models/tiny", timeout=0.5
        ) as client:
            with pytest.raises(InferenceTimeoutError) as caught:
                await client.text_generation("hello", max_new_tokens=4)
    assert isinstance(caught.value.__cause__, DeadlineExceededError)
    assert gate.statistics().attempts == 1
