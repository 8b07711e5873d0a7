"""Multipath against real servers: hedging, upstream sets, failover, the stream commit point.

Every server here is a real ``yieldgate serve`` process on 127.0.0.1 (see
tests/conftest.py); the Gate is exercised only through the public clients.
"""

from __future__ import annotations

import functools
import random
import signal
from typing import Any

import anyio
import httpx
import pytest

from tests.conftest import stats_when as poll_stats
from yieldgate import (
    BreakerPolicy,
    Gate,
    GatePolicy,
    GovernedClient,
    HedgePolicy,
    RetryBudgetPolicy,
    RetryPolicy,
    StreamInterruptedError,
    WindowPolicy,
    http_client,
)
from yieldgate.burst import Percentiles
from yieldgate.gate import NullInstrumentation
from yieldgate.server import ServerProcess, spawn

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


async def server_stats(server: ServerProcess) -> dict[str, Any]:
    async with GovernedClient(server.url) as client:
        return await client.stats()


async def stats_when(server: ServerProcess, predicate: Any, timeout: float) -> dict[str, Any]:
    """Poll the server's ``stats`` until ``predicate(stats)`` holds."""
    return await poll_stats(functools.partial(server_stats, server), predicate, timeout)


def p99(values: list[float]) -> float:
    found = Percentiles.of(values).p99
    assert found is not None
    return found


def slower_than(values: list[float], seconds: float) -> int:
    return sum(1 for v in values if v > seconds)


async def timed_burst(client: GovernedClient, calls: int, concurrency: int) -> list[float]:
    latencies: list[float] = []

    async def one(i: int) -> None:
        start = anyio.current_time()
        result = await client.submit(f"request {i}")
        assert result["text"] == f"request {i}"
        latencies.append(anyio.current_time() - start)

    limiter = anyio.Semaphore(concurrency)

    async def gated(i: int) -> None:
        async with limiter:
            await one(i)

    async with anyio.create_task_group() as tg:
        for i in range(calls):
            tg.start_soon(gated, i)
    return latencies


async def hedged_and_unhedged(
    urls: list[str], hedge: HedgePolicy, calls: int, window: WindowPolicy | None = None
) -> dict[str, tuple[list[float], Any]]:
    results: dict[str, tuple[list[float], Any]] = {}
    for mode, policy in (("unhedged", None), ("hedged", hedge)):
        gate = Gate(
            GatePolicy(hedge=policy, window=window or WindowPolicy()),
            name=mode,
            upstreams={u: u for u in urls} if len(urls) > 1 else None,
            instrumentation=NullInstrumentation(),
            rng=random.Random(11),
        )
        async with GovernedClient(urls, gate=gate) as client:
            latencies = await timed_burst(client, calls, concurrency=8)
        results[mode] = (latencies, gate.statistics())
    return results


async def test_hedging_cuts_the_p99_of_a_long_tail_within_the_budget(serve: Any) -> None:
    # 15% of executions take 1.5 s, the rest 20 ms: the tail of a busy replica.
    server = serve("--max-inflight", "128", "--exec-mix", "20:0.85,1500:0.15", "--seed", "5")
    calls = 120
    hedge = HedgePolicy(delay_s=0.1, max_hedges=3)
    results = await hedged_and_unhedged([server.url], hedge, calls)
    unhedged, unhedged_stats = results["unhedged"]
    hedged, stats = results["hedged"]
    # Judged by counts with wide margins, not by a ratio of timings: unhedged, every
    # call that drew the 1.5 s tail waited for it (about 18: one draw per call, from
    # the server's seeded sequence); hedged, a call waits for the tail only if all
    # four of its attempts drew it (0.15^4), whatever the machine's load.
    tail = slower_than(unhedged, 1.4)
    assert tail >= 10, sorted(unhedged)[-20:]
    assert unhedged_stats.attempts == calls
    assert slower_than(hedged, 1.4) <= 1, sorted(hedged)[-5:]
    assert p99(hedged) < p99(unhedged)
    assert stats.hedges > 0
    # Hedges spend the retry budget: 20% of the calls plus 1/s over its 10 s window.
    assert stats.attempts <= calls * 1.2 + 10, stats
    assert stats.calls_ok == calls
    after = await server_stats(server)
    assert after["inflight"] == 0  # the losers were cancelled, not left running
    assert after["cancelled_total"] >= stats.losers_cancelled > 0


async def test_hedging_across_a_slow_and_a_fast_upstream(serve: Any) -> None:
    # "slow" draws 1.5 s for half its requests; "fast" always answers in 20 ms.
    slow = serve("--max-inflight", "64", "--exec-mix", "20:0.5,1500:0.5", "--seed", "5")
    fast = serve("--max-inflight", "64", "--exec-ms", "20")
    calls = 120
    # A window wide enough that a hedge always finds a free slot on "fast": hedges never
    # queue, and the point here is where they go, not whether there is room.
    window = WindowPolicy(initial=16, max=16)
    results = await hedged_and_unhedged([slow.url, fast.url], HedgePolicy.fixed(0.1), calls, window)
    unhedged, _ = results["unhedged"]
    hedged, stats = results["hedged"]
    # Unhedged, the router learns to avoid "slow" only after it was slow for someone;
    # hedged, nobody waits for a slow draw (1.5 s): the hedge went to "fast" after
    # 0.1 s. (Counts with a wide margin: the machine's load moves the fast times.)
    assert slower_than(unhedged, 1.4) >= 1
    assert slower_than(hedged, 1.4) == 0, max(hedged)
    assert p99(hedged) <= p99(unhedged)
    assert stats.attempts <= calls * 1.2 + 10, stats
    assert (await server_stats(slow))["inflight"] == 0


async def test_a_losing_hedge_is_cancelled_on_its_server_at_once(serve: Any) -> None:
    slow = serve("--max-inflight", "8", "--exec-ms", "5000")
    fast = serve("--max-inflight", "8", "--exec-ms", "20")
    urls = [slow.url, fast.url]
    gate = Gate(
        GatePolicy(hedge=HedgePolicy.fixed(0.2)),
        upstreams={u: u for u in urls},
        instrumentation=NullInstrumentation(),
        rng=random.Random(1),
    )
    async with GovernedClient(urls, gate=gate) as client:
        for i in range(20):  # until the primary lands on the slow server once
            await client.submit(f"r{i}")
            if gate.statistics().hedge_wins:
                break
        assert gate.statistics().hedge_wins == 1
        stats = await stats_when(slow, lambda s: s["inflight"] == 0, timeout=4.0)
    # The 5 s execution was cancelled, not finished, and its slot freed long before.
    assert stats["cancelled_total"] == 1
    assert stats["executed_total"] == 0


async def test_a_losing_hedge_over_http_is_cancelled_on_its_server(serve: Any) -> None:
    slow = serve("--max-inflight", "8", "--exec-ms", "5000", "--http-port", "0")
    fast = serve("--max-inflight", "8", "--exec-ms", "20", "--http-port", "0")
    assert slow.http_url is not None
    assert fast.http_url is not None
    gate = Gate(
        GatePolicy(hedge=HedgePolicy.fixed(0.2)),
        upstreams={"slow": slow.http_url, "fast": fast.http_url},
        instrumentation=NullInstrumentation(),
        rng=random.Random(2),
    )
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    seen_keys: set[str] = set()
    async with http_client(
        gate, dialect="openai", flavor="httpx", base_url="http://placeholder.invalid"
    ) as client:
        for _ in range(20):
            response = await client.post("/v1/chat/completions", json=body)
            assert response.status_code == 200
            seen_keys.add(response.request.headers["idempotency-key"])
            if gate.statistics().hedge_wins:
                break
    assert gate.statistics().hedge_wins == 1
    stats = await stats_when(slow, lambda s: s["inflight"] == 0, timeout=4.0)
    assert stats["cancelled_total"] == 1
    assert stats["executed_total"] == 0  # cancelled long before its 5 s were up
    assert len(seen_keys) == gate.statistics().calls  # one key per call


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
async def test_failover_when_an_upstream_stops_mid_run(serve: Any, how: str) -> None:
    a = serve("--max-inflight", "16", "--exec-ms", "30", "--grace-s", "0.2")
    b = serve("--max-inflight", "16", "--exec-ms", "30", "--grace-s", "0.2")
    urls = [a.url, b.url]
    gate = Gate(
        GatePolicy(retry=RetryPolicy(base_s=0.05)),
        upstreams=urls,  # names only: the client gives them their targets
        instrumentation=NullInstrumentation(),
    )
    done = 0
    calls = 300

    async def one(i: int) -> None:
        nonlocal done
        assert (await client.submit(f"r{i}"))["text"] == f"r{i}"
        done += 1

    async with GovernedClient(urls, gate=gate) as client:
        limiter = anyio.Semaphore(16)

        async def gated(i: int) -> None:
            async with limiter:
                await one(i)

        async with anyio.create_task_group() as tg:
            for i in range(calls):
                tg.start_soon(gated, i)
            with anyio.fail_after(30):
                while done < 60:  # noqa: ASYNC110 - counted by the callers
                    await anyio.sleep(0.01)
            # Stop whichever upstream is doing the most now.
            by_url = {u.name: u for u in gate.statistics().upstreams}
            victim_url = (
                urls[0] if by_url[urls[0]].attempts >= by_url[urls[1]].attempts else urls[1]
            )
            victim = a if victim_url == urls[0] else b
            victim_ok_at_stop = by_url[victim_url].successes
            victim.send_signal(signal.SIGKILL if how == "SIGKILL" else signal.SIGTERM)
    assert done == calls  # 100% success through the other
    stats = gate.statistics()
    assert stats.calls_ok == calls
    by_url = {u.name: u for u in stats.upstreams}
    survivor_url = urls[1] if victim_url == urls[0] else urls[0]
    survivor = b if victim is a else a
    assert by_url[victim_url].successes + by_url[survivor_url].successes == calls
    served = await server_stats(survivor)
    # Every answer the client took from the survivor, the survivor executed.
    assert served["executed_total"] >= by_url[survivor_url].successes
    if how == "SIGKILL":
        # A killed server answers nothing more: after the kill, the victim's only
        # successes are replies already on their way (at most the 16 in flight).
        # (A SIGTERM lets it finish admitted work within its grace, and admit
        # more until it has handled the signal: no bound holds on a loaded machine.)
        assert by_url[victim_url].successes - victim_ok_at_stop <= 16


async def test_a_stream_that_fails_after_its_first_chunk_raises_with_the_partial_output(
    serve: Any,
) -> None:
    server = serve("--max-inflight", "4")
    gate = Gate(instrumentation=NullInstrumentation())
    async with GovernedClient(server.url, gate=gate) as client:
        received: list[Any] = []

        async def read_all() -> None:
            params = {"fail": True, "chunks": 3, "exec_ms": 60}
            async with client.stream("abcdef", params=params) as chunks:
                async for piece in chunks:
                    received.append(piece)

        with pytest.raises(StreamInterruptedError) as caught:
            await read_all()
        stats = await client.stats()
    # Every chunk the server sent arrived, once, and the error carries them.
    assert received == [{"text": "ab"}, {"text": "cd"}, {"text": "ef", "last": True}]
    assert caught.value.chunks == received
    assert "backend_error" in str(caught.value.__cause__)
    assert stats["admitted_total"] == 1  # never silently restarted
    assert gate.statistics().attempts == 1


async def test_a_stream_that_fails_before_its_first_chunk_is_retried_transparently(
    serve: Any,
) -> None:
    first = serve("--max-inflight", "4")
    port = first.port
    gate = Gate(
        GatePolicy(
            retry=RetryPolicy(max_attempts=40, base_s=0.05, max_backoff_s=0.3),
            budget=RetryBudgetPolicy.unlimited(),
            breaker=BreakerPolicy.disabled(),
        ),
        instrumentation=NullInstrumentation(),
    )
    replacement: list[ServerProcess] = []
    try:
        async with GovernedClient(first.url, gate=gate) as client:
            received: list[Any] = []

            async def kill_before_the_first_chunk() -> None:
                await stats_when(first, lambda s: s["inflight"] == 1, timeout=10)
                first.send_signal(signal.SIGKILL)  # admitted, no chunk sent yet
                first.wait()
                replacement.append(
                    await anyio.to_thread.run_sync(
                        lambda: spawn("--max-inflight", "4", "--port", str(port))
                    )
                )

            async with anyio.create_task_group() as tg:
                tg.start_soon(kill_before_the_first_chunk)
                async with client.stream("abcdef", params={"chunks": 2, "exec_ms": 2000}) as chunks:
                    async for piece in chunks:
                        received.append(piece)
            assert received == [{"text": "abc"}, {"text": "def", "last": True}]
            assert chunks.result["text"] == "abcdef"
        assert gate.statistics().attempts >= 2
        assert gate.statistics().calls_ok == 1
    finally:
        for server in replacement:
            server.stop()


async def test_plain_httpx_retries_a_connection_refused_on_the_other_upstream(
    serve: Any,
) -> None:
    up = serve("--max-inflight", "4", "--http-port", "0")
    assert up.http_url is not None
    down = "http://127.0.0.1:9"  # nothing listens on the discard port
    gate = Gate(upstreams=[down, up.http_url], instrumentation=NullInstrumentation())
    async with http_client(gate, dialect="tgi", flavor="httpx") as client:
        for _ in range(10):
            response = await client.post(
                "http://placeholder.invalid/generate", json={"inputs": "hello"}
            )
            assert response.status_code == 200
    by_name = {u.name: u for u in gate.statistics().upstreams}
    assert by_name[up.http_url].successes == 10
    assert isinstance(client, httpx.AsyncClient)
