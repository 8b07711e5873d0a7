"""HuggingFace's text-generation client (on aiohttp) wrapped whole in ``gate.call``.

It takes no HTTP client of ours, so each call goes through ``gate.call`` with
the TGI dialect as classifier: it reads the client's exceptions by the names
of their classes (``OverloadedError`` and ``RateLimitExceededError`` are
yields). Against the reference server's TGI route (``POST /``) with few slots,
a burst that the bare client loses part of all succeeds through the Gate.

The calls stream (``generate_stream``, collected inside the governed call):
the server's non-streamed answer lacks the ``details`` that the client's
``Response`` requires, which the last test pins until the server sends it.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable

import pytest
from text_generation import AsyncClient
from text_generation.errors import OverloadedError, RateLimitExceededError

from tests.compat.burst import CALLS, burst
from yieldgate import Gate
from yieldgate.dialects import TGI
from yieldgate.server import ServerProcess

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.e2e,
    # text-generation 0.7.0 calls pydantic's deprecated .dict() on every request.
    pytest.mark.filterwarnings("ignore:The `dict` method is deprecated"),
]


def generate(client: AsyncClient, i: int) -> Callable[[], Awaitable[str]]:
    async def call() -> str:
        pieces = [r.token.text async for r in client.generate_stream(f"hi {i}", max_new_tokens=8)]
        return "".join(pieces)

    return call


async def test_the_bare_client_loses_part_of_a_burst(server: ServerProcess) -> None:
    client = AsyncClient(server.http_url or "", timeout=30)
    seen = await burst(server, [generate(client, i) for i in range(CALLS)])
    refused = seen.failures
    assert refused, "the burst never overloaded the server: the next test would show nothing"
    assert all(isinstance(e, OverloadedError | RateLimitExceededError) for e in refused)


async def test_through_gate_call_with_the_tgi_dialect_a_burst_all_succeeds(
    server: ServerProcess,
) -> None:
    gate = Gate(name="tgi")
    client = AsyncClient(server.http_url or "", timeout=30)

    def governed(i: int) -> Callable[[], Awaitable[str]]:
        return functools.partial(gate.call, generate(client, i), classify=TGI)

    seen = await burst(server, [governed(i) for i in range(CALLS)])
    seen.assert_all_succeeded()
    assert seen.results == [f"hi {i}" for i in range(CALLS)]
    stats = gate.statistics()
    assert stats.calls_ok == CALLS
    assert stats.window.inflight == 0


async def test_a_non_streamed_generate_parses(server: ServerProcess) -> None:
    # The client always asks for details=True, and its Response requires them.
    client = AsyncClient(server.http_url or "", timeout=30)
    response = await client.generate("hi", max_new_tokens=4)
    assert response.generated_text == "hi"
    assert response.details.generated_tokens >= 1
