"""No error a gated HTTP client raises has a cycle in its ``__cause__``/``__context__`` chain.

Every way a request through ``http_client`` (async and sync) and the official
clients (``openai_client``, ``anthropic_client``, an official client given
``http_client``) can fail is driven against real sockets where the fault
lives in the network (a refused port, a slow server, a connection pool of a
closed event loop) and an inner ``MockTransport`` where it is an answer (a
503, a 429, a 400) or an inner transport's own bug; each error's chain is
walked (``tests/chains.py``). The Gate's own errors are walked in
tests/gate/test_error_chains.py.

The reported cycle: a ``RuntimeError('Event loop is closed')`` raised again
by the transport while the Gate's ``CallFailedError`` (whose ``__cause__`` it
is) was being handled became that error's ``__context__``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import anthropic
import anyio
import openai
import pytest

import yieldgate
from tests.chains import assert_acyclic
from yieldgate import GatePolicy, RetryPolicy, TimeoutPolicy
from yieldgate.server import ServerProcess, spawn
from yieldgate.transports._flavor import detect_flavor, library

pytestmark = pytest.mark.anyio

LIB = library(detect_flavor())  # the library of http_client's and openai's clients
ANTHROPICS = detect_flavor(client="anthropic")
MESSAGES = [{"role": "user", "content": "hi"}]
BODY = {"model": "m", "messages": MESSAGES}


def quick_gate(**policy: Any) -> yieldgate.Gate:
    return yieldgate.Gate(
        GatePolicy(retry=RetryPolicy(max_attempts=2, base_s=0.001, max_yields=2), **policy)
    )


def answering(status: int, headers: dict[str, str] | None = None, lib: Any = LIB) -> Any:
    """An inner transport that answers every request with ``status``."""
    return lib.MockTransport(
        lambda request: lib.Response(status, headers=headers or {}, json={"error": "no"})
    )


def broken(lib: Any = LIB) -> Any:
    """An inner transport with a bug of its own: every request raises ``RuntimeError``."""

    def handler(request: Any) -> Any:
        raise RuntimeError("a bug in the inner transport")

    return lib.MockTransport(handler)


async def error_of(call: Callable[[], Awaitable[Any]]) -> BaseException:
    try:
        await call()
    except Exception as exc:
        assert_acyclic(exc)
        return exc
    raise AssertionError("no error was raised")


def sync_error_of(call: Callable[[], Any]) -> BaseException:
    try:
        call()
    except Exception as exc:
        assert_acyclic(exc)
        return exc
    raise AssertionError("no error was raised")


def post(client: Any) -> Callable[[], Awaitable[Any]]:
    return lambda: client.post("/v1/chat/completions", json=BODY)


async def test_refused_connections_and_then_an_open_circuit(refused_url: str) -> None:
    client = yieldgate.http_client(quick_gate(), base_url=refused_url)
    refused = await error_of(post(client))
    assert isinstance(refused, yieldgate.RetriesExhaustedError)
    assert isinstance(refused, LIB.TransportError)
    gate = yieldgate.Gate(
        GatePolicy(
            retry=RetryPolicy(max_attempts=1),
            breaker=yieldgate.BreakerPolicy(fail_max=1, reset_timeout_s=60),
        )
    )
    client = yieldgate.http_client(gate, base_url=refused_url)
    assert isinstance(await error_of(post(client)), yieldgate.GaveUpError)
    assert isinstance(await error_of(post(client)), yieldgate.CircuitOpenError)


async def test_an_inner_transport_that_raises(refused_url: str) -> None:
    client = yieldgate.http_client(quick_gate(), base_url=refused_url, inner=broken())
    error = await error_of(post(client))
    assert isinstance(error, RuntimeError)  # the inner transport's own error, as is


async def test_attempt_timeouts_and_the_total_timeout(slow_server: ServerProcess) -> None:
    attempts = quick_gate(timeout=TimeoutPolicy(attempt_s=0.2, total_s=None))
    client = yieldgate.http_client(attempts, base_url=slow_server.http_url)
    assert isinstance(await error_of(post(client)), yieldgate.RetriesExhaustedError)
    total = quick_gate(timeout=TimeoutPolicy(attempt_s=None, total_s=0.3))
    client = yieldgate.http_client(total, base_url=slow_server.http_url)
    assert isinstance(await error_of(post(client)), yieldgate.DeadlineExceededError)


async def test_a_request_cancelled_in_flight(slow_server: ServerProcess) -> None:
    client = yieldgate.http_client(yieldgate.Gate(), base_url=slow_server.http_url)
    caught: list[BaseException] = []
    with anyio.move_on_after(0.2):
        try:
            await post(client)()
        except anyio.get_cancelled_exc_class() as exc:
            caught.append(exc)
            raise
    (cancelled,) = caught
    assert_acyclic(cancelled)


@pytest.mark.parametrize(("status", "headers"), [(503, {}), (429, {"retry-after": "0"}), (400, {})])
async def test_answers_the_gate_gives_up_on_or_does_not_retry(
    status: int, headers: dict[str, str]
) -> None:
    client = yieldgate.http_client(
        quick_gate(), base_url="http://upstream", inner=answering(status, headers)
    )
    response = await post(client)()
    assert response.status_code == status
    assert_acyclic(response.extensions["yieldgate_error"])
    assert isinstance(sync_error_of(response.raise_for_status), LIB.HTTPStatusError)


def test_sync_client_errors(refused_url: str) -> None:
    refused = yieldgate.http_client(quick_gate(), sync=True, base_url=refused_url)
    assert isinstance(
        sync_error_of(lambda: refused.post("/v1/chat/completions", json=BODY)),
        yieldgate.RetriesExhaustedError,
    )
    buggy = yieldgate.http_client(quick_gate(), sync=True, base_url=refused_url, inner=broken())
    assert isinstance(
        sync_error_of(lambda: buggy.post("/v1/chat/completions", json=BODY)), RuntimeError
    )


def test_call_sync_errors() -> None:
    gate = quick_gate()

    def fails() -> None:
        raise ConnectionResetError("reset")

    assert isinstance(sync_error_of(lambda: gate.call_sync(fails)), yieldgate.GaveUpError)

    async def in_a_loop() -> BaseException:
        return sync_error_of(lambda: gate.call_sync(fails))

    assert isinstance(asyncio.run(in_a_loop()), yieldgate.BlockingCallError)


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with spawn("--max-inflight", "4", "--exec-ms", "5", "--http-port", "0") as proc:
        yield proc


def test_a_pool_of_a_closed_event_loop_under_the_official_clients(server: ServerProcess) -> None:
    """The reported chain: ``RuntimeError('Event loop is closed')`` from a pool of the
    first loop, raised by openai as is and by anthropic as ``APIConnectionError``'s
    cause. yieldgate's own transports build a pool per loop; an ``inner`` of the
    caller's is used as given, so its pool still meets the closed loop."""
    gate = quick_gate()
    chat = openai.AsyncOpenAI(
        base_url=f"{server.http_url}/v1",
        api_key="k",
        max_retries=0,
        http_client=yieldgate.http_client(gate, inner=LIB.AsyncHTTPTransport()),
    )
    lib = library(ANTHROPICS)
    messages = anthropic.AsyncAnthropic(
        base_url=server.http_url,
        api_key="k",
        max_retries=0,
        http_client=yieldgate.http_client(
            gate, dialect="anthropic", flavor=ANTHROPICS, inner=lib.AsyncHTTPTransport()
        ),
    )

    async def openai_call() -> Any:
        return await chat.chat.completions.create(model="m", messages=MESSAGES)

    async def anthropic_call() -> Any:
        return await messages.messages.create(model="m", max_tokens=8, messages=MESSAGES)

    for call in (openai_call, anthropic_call):
        asyncio.run(call())  # the pool keeps this loop's connection for the next request
        error = sync_error_of(lambda call=call: asyncio.run(call()))
        assert "Event loop is closed" in repr(error) + repr(error.__cause__)


def test_the_official_clients_errors_when_the_gate_gives_up(
    refused_url: str, slow_server: ServerProcess
) -> None:
    async def main() -> list[BaseException]:
        errors = []
        for client in (
            yieldgate.openai_client(quick_gate(), base_url=refused_url, api_key="k"),
            yieldgate.openai_client(
                yieldgate.Gate(), base_url=f"{slow_server.http_url}/v1", api_key="k", timeout=0.3
            ),
            openai.AsyncOpenAI(
                base_url="http://upstream/v1",
                api_key="k",
                max_retries=0,
                http_client=yieldgate.http_client(quick_gate(), inner=answering(503)),
            ),
        ):
            errors.append(
                await error_of(
                    lambda client=client: client.chat.completions.create(
                        model="m", messages=MESSAGES
                    )
                )
            )
        lib = library(ANTHROPICS)
        for client in (
            yieldgate.anthropic_client(quick_gate(), base_url=refused_url, api_key="k"),
            anthropic.AsyncAnthropic(
                base_url="http://upstream",
                api_key="k",
                max_retries=0,
                http_client=yieldgate.http_client(
                    quick_gate(),
                    dialect="anthropic",
                    flavor=ANTHROPICS,
                    inner=answering(529, lib=lib),
                ),
            ),
        ):
            errors.append(
                await error_of(
                    lambda client=client: client.messages.create(
                        model="m", max_tokens=8, messages=MESSAGES
                    )
                )
            )
        return errors

    connection, timeout, unavailable, anthropic_connection, overloaded = asyncio.run(main())
    assert isinstance(connection, openai.APIConnectionError)
    assert isinstance(timeout, openai.APITimeoutError)
    assert isinstance(unavailable, openai.InternalServerError)
    assert isinstance(anthropic_connection, anthropic.APIConnectionError)
    assert isinstance(overloaded, anthropic.APIStatusError)
    assert overloaded.status_code == 529
