"""Faulty upstreams through the async GateTransport: real (tiny) HTTP servers on loopback.

A 5xx storm: the upstream answers 502 to everything while it is "down". After
the storm: every caller got a response or a typed error within its deadline,
no window slot is held, the breaker is open (callers are turned away without
reaching the upstream), and once the upstream heals one probe closes it again.

An error body dripped a byte at a time: the call still ends by its deadline.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc
import openai
import pytest

import yieldgate
from tests.transports.conftest import DrippingUpstream
from yieldgate import BreakerPolicy, Gate, GatePolicy, RetryPolicy, TimeoutPolicy

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]


@dataclass
class Upstream:
    url: str
    down: bool = True
    requests: int = 0


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    async with await anyio.create_tcp_listener(local_host="127.0.0.1") as listener:
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        state = Upstream(url=f"http://127.0.0.1:{port}")

        async def handle(stream: anyio.abc.SocketStream) -> None:
            async with stream:
                data = b""
                try:
                    while b"\r\n\r\n" not in data:
                        data += await stream.receive()
                    head, _, body = data.partition(b"\r\n\r\n")
                    length = 0
                    for line in head.split(b"\r\n")[1:]:
                        name, _, value = line.partition(b":")
                        if name.strip().lower() == b"content-length":
                            length = int(value)
                    while len(body) < length:
                        body += await stream.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    return
                state.requests += 1
                if state.down:
                    status, body = b"502 Bad Gateway", b""
                else:
                    status, body = b"200 OK", b"{}"
                await stream.send(
                    b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\n"
                    b"content-length: " + str(len(body)).encode() + b"\r\n"
                    b"connection: close\r\n\r\n" + body
                )

        async with anyio.create_task_group() as tg:
            tg.start_soon(listener.serve, handle)
            yield state
            tg.cancel_scope.cancel()


async def test_a_5xx_storm_opens_the_breaker_and_one_probe_closes_it(upstream: Upstream) -> None:
    gate = Gate(
        GatePolicy(
            retry=RetryPolicy(max_attempts=3, base_s=0.01),
            breaker=BreakerPolicy(fail_max=5, reset_timeout_s=0.5),
            timeout=TimeoutPolicy(total_s=5),
        )
    )
    outcomes: list[str] = []
    async with yieldgate.http_client(
        gate, dialect="openai", flavor="httpx", base_url=upstream.url
    ) as client:

        async def storm_call() -> None:
            try:
                response = await client.post("/v1/completions", json={"prompt": "x"})
                outcomes.append(str(response.status_code))
            except yieldgate.CircuitOpenError:
                outcomes.append("open")

        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                for _ in range(200):
                    tg.start_soon(storm_call)
        assert len(outcomes) == 200
        assert set(outcomes) <= {"502", "open"}
        assert outcomes.count("open") > 0  # the breaker opened during the storm
        # Far fewer requests reached the upstream than 200 calls x 3 attempts.
        assert upstream.requests < 200
        stats = gate.statistics()
        assert stats.window.inflight == 0
        assert stats.breaker == "open"
        # While open, calls fail fast and never reach the upstream.
        seen = upstream.requests
        with pytest.raises(yieldgate.CircuitOpenError):
            await client.post("/v1/completions", json={"prompt": "x"})
        assert upstream.requests == seen
        # Healed upstream, reset timeout passed: one probe closes the breaker.
        upstream.down = False
        await anyio.sleep(0.6)
        response = await client.post("/v1/completions", json={"prompt": "x"})
        assert response.status_code == 200
        assert upstream.requests == seen + 1
        assert gate.statistics().breaker == "closed"
        assert gate.statistics().window.inflight == 0


@pytest.mark.parametrize("flavor", ["httpx2", "httpx"])
async def test_an_error_body_dripped_slowly_ends_by_the_deadline(
    slow_429: DrippingUpstream, flavor: str
) -> None:
    # The attempt runs under a cancel scope: the read is cancelled at the deadline
    # (it becomes the attempt's timeout), not left to run for the whole body's 11 s.
    gate = Gate(GatePolicy(timeout=TimeoutPolicy(total_s=2.0)), name="dripping")
    async with yieldgate.http_client(gate, flavor=flavor, base_url=slow_429.url) as client:
        started = time.monotonic()
        with pytest.raises(yieldgate.DeadlineExceededError):
            await client.post("/v1/chat/completions", json={"model": "m"})
        elapsed = time.monotonic() - started
    assert elapsed < 5.0
    assert gate.statistics().window.inflight == 0


async def test_the_async_openai_client_times_out_by_the_deadline(
    slow_429: DrippingUpstream,
) -> None:
    gate = Gate(GatePolicy(timeout=TimeoutPolicy(total_s=2.0)), name="dripping")
    messages: Any = [{"role": "user", "content": "hello"}]
    async with yieldgate.openai_client(
        gate, base_url=f"{slow_429.url}/v1", api_key="unused"
    ) as client:
        started = time.monotonic()
        with pytest.raises(openai.APITimeoutError):
            await client.chat.completions.create(model="m", messages=messages)
        elapsed = time.monotonic() - started
    assert elapsed < 5.0  # 2 s allowed; the whole body takes 11 s
    assert gate.statistics().window.inflight == 0
