"""Client fault matrix: the server dies or hangs, calls are cancelled by the thousand.

After each: a typed ``YieldgateError`` within the deadline, the Gate's window
holds no slot, and the client has no connection task left behind.
"""

from __future__ import annotations

import functools
import random
import signal
from typing import Any

import anyio
import anyio.abc
import pytest

from yieldgate import Gate, GatePolicy, GovernedClient, RetryPolicy, TimeoutPolicy, YieldgateError
from yieldgate.server import ServerProcess

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]


def no_slots_held(gate: Gate) -> bool:
    window = gate.statistics().window
    return window.inflight == 0 and window.waiting == 0


async def test_a_server_killed_mid_flight_is_a_typed_error_within_the_deadline(
    serve: Any,
) -> None:
    server: ServerProcess = serve("--max-inflight", "8", "--exec-ms", "5000")
    policy = GatePolicy(retry=RetryPolicy(base_s=0.05), timeout=TimeoutPolicy(total_s=3))
    gate = Gate(policy)
    errors: list[BaseException] = []
    async with GovernedClient(server.url, gate=gate) as client:

        async def call(i: int) -> None:
            try:
                await client.submit(f"work {i}")
            except YieldgateError as exc:
                errors.append(exc)

        started = anyio.current_time()
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                for i in range(8):
                    tg.start_soon(call, i)
                await anyio.sleep(0.3)
                server.send_signal(signal.SIGKILL)
        took = anyio.current_time() - started
    assert len(errors) == 8
    assert took < 3.5  # the total deadline, plus scheduling slack
    assert no_slots_held(gate)


async def test_a_hung_server_is_a_typed_error_within_the_deadline() -> None:
    # Accepts connections, reads everything, never answers.
    async with await anyio.create_tcp_listener(local_host="127.0.0.1") as listener:
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        async with anyio.create_task_group() as server:

            async def swallow(stream: anyio.abc.SocketStream) -> None:
                async with stream:
                    try:
                        while True:
                            await stream.receive()
                    except (anyio.EndOfStream, anyio.BrokenResourceError):
                        pass

            server.start_soon(listener.serve, swallow)
            policy = GatePolicy(timeout=TimeoutPolicy(total_s=1))
            gate = Gate(policy)
            async with GovernedClient(f"tcp://127.0.0.1:{port}", gate=gate) as client:
                started = anyio.current_time()
                with pytest.raises(YieldgateError):
                    await client.submit("anyone?")
                assert anyio.current_time() - started < 1.5
            assert no_slots_held(gate)
            server.cancel_scope.cancel()


async def test_a_cancellation_storm_leaks_nothing(serve: Any) -> None:
    # Executions (300 ms) outlast every caller's patience (up to 80 ms).
    server: ServerProcess = serve("--max-inflight", "16", "--exec-ms", "300")
    gate = Gate(GatePolicy(retry=RetryPolicy(base_s=0.01)))
    rng = random.Random(3)
    async with GovernedClient(server.url, gate=gate) as client:

        async def call(i: int) -> None:
            # Cancelled at a random point: before sending, while yielded, or mid-execution.
            with anyio.move_on_after(rng.uniform(0, 0.08)):
                await client.submit(f"storm {i}")

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for i in range(2000):
                    tg.start_soon(call, i)
        assert no_slots_held(gate)

        # On a loaded machine few of the storm's calls reach the server in time, so
        # cancel some that surely did: eight long ones, once the server runs them all.
        async with anyio.create_task_group() as tg:
            for i in range(8):
                tg.start_soon(
                    functools.partial(client.submit, f"long {i}", params={"exec_ms": 60_000})
                )
            with anyio.fail_after(30):
                while (await client.stats())["inflight"] < 8:  # noqa: ASYNC110
                    await anyio.sleep(0.02)
            tg.cancel_scope.cancel()
        assert no_slots_held(gate)

        # The server saw every cancelled submit go: nothing is left in flight there.
        with anyio.fail_after(10):
            while (stats := await client.stats())["inflight"]:  # noqa: ASYNC110
                await anyio.sleep(0.02)
        assert stats["connections_open"] == 1
        assert stats["admitted_total"] == (
            stats["executed_total"] + stats["failed_total"] + stats["cancelled_total"]
        )
        # Calls cancelled mid-execution were cancelled on the server too (the cancel
        # op), not run to their end: the eight long ones at least.
        assert stats["cancelled_total"] >= 8
        # And the client still works.
        assert (await client.submit("after the storm"))["text"] == "after the storm"


@pytest.mark.parametrize(
    "answer",
    [
        b'{"id":"1","status":"ok","res',  # a reply cut off, then the connection closes
        b"",  # the connection closes with no reply at all
        b'{"id":"1","status":"ok","result":{"text":"x"},"exec_ms":1}',  # no newline, then close
    ],
)
async def test_truncated_replies_and_resets_are_typed_errors(answer: bytes) -> None:
    async with await anyio.create_tcp_listener(local_host="127.0.0.1") as listener:
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        async with anyio.create_task_group() as server:

            async def truncate(stream: anyio.abc.SocketStream) -> None:
                with anyio.move_on_after(5):
                    await stream.receive()
                    if answer:
                        await stream.send(answer)
                    # SO_LINGER 0 would be a hard reset; closing mid-line is what matters.
                    await stream.aclose()

            server.start_soon(listener.serve, truncate)
            policy = GatePolicy(retry=RetryPolicy(base_s=0.01), timeout=TimeoutPolicy(total_s=2))
            gate = Gate(policy)
            async with GovernedClient(f"tcp://127.0.0.1:{port}", gate=gate) as client:
                started = anyio.current_time()
                with pytest.raises(YieldgateError):
                    await client.submit("x")
                assert anyio.current_time() - started < 2.5
            assert no_slots_held(gate)
            server.cancel_scope.cancel()
