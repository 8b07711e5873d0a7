"""A 5xx storm through the GateTransport, against a real (tiny) HTTP upstream on loopback.

The upstream answers 502 to everything while it is "down". After the storm:
every caller got a response or a typed error within its deadline, no window
slot is held, the breaker is open (callers are turned away without reaching
the upstream), and once the upstream heals one probe closes it again.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import anyio
import anyio.abc
import pytest

import yieldgate
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
