"""``yieldgate serve --queue``: buffering past max_inflight, in a real server process.

Every wait here is on a condition (the server's counters), never on a sleep
being long enough: the tests hold with both cores busy.
"""

from __future__ import annotations

from typing import Any

import anyio
import httpx
import pytest

from tests.conftest import RawClient, stats_when, submit
from yieldgate.protocol import cancel_frame
from yieldgate.server import ServerProcess

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

HOLD = {"exec_ms": 60_000}  # occupies the one slot until cancelled
QUICK = {"exec_ms": 5}


async def hold_the_slot(client: RawClient) -> str:
    rid = client.next_id()
    await client.send(submit(rid, params=HOLD))
    await client.stats_when(lambda s: s["inflight"] == 1)
    return rid


async def test_queued_in_order_and_the_one_past_the_bound_is_refused(
    serve: Any, connect: Any
) -> None:
    server: ServerProcess = serve("--max-inflight", "1", "--queue", "2", "--exec-ms", "5")
    client: RawClient = await connect(server)
    held = await hold_the_slot(client)
    first, second = client.next_id(), client.next_id()
    await client.send(submit(first, params=QUICK))
    await client.send(submit(second, params=QUICK))
    await client.stats_when(lambda s: s["queued"] == 2)
    refused = await client.submit(params=QUICK)  # the third past the slot: N + 1
    assert (refused["status"], refused["reason"]) == ("yield", "saturated")
    assert refused["retry_hint_ms"] > 0

    await client.send(cancel_frame(held))
    replies = [await client.recv() for _ in range(3)]
    assert [(r["id"], r["status"]) for r in replies] == [
        (held, "error"),
        (first, "ok"),
        (second, "ok"),
    ]
    stats = await client.stats()
    assert (stats["queued"], stats["queued_peak"], stats["queued_total"]) == (0, 2, 2)
    assert (stats["max_queued"], stats["queue_waits_total"], stats["yielded_total"]) == (2, 2, 1)
    assert stats["queue_wait_ms_total"] > 0


async def test_queue_zero_is_no_queue(serve: Any, connect: Any) -> None:
    server: ServerProcess = serve("--max-inflight", "1", "--queue", "0")
    client: RawClient = await connect(server)
    await hold_the_slot(client)
    reply = await client.submit(params=QUICK)
    assert reply["status"] == "yield"
    assert (await client.stats())["queued_total"] == 0


async def test_deadline_while_queued(serve: Any, connect: Any) -> None:
    server: ServerProcess = serve("--max-inflight", "1", "--queue", "4", "--http-port", "0")
    client: RawClient = await connect(server)
    await hold_the_slot(client)
    reply = await client.submit(params=QUICK, deadline_ms=50)
    assert (reply["status"], reply["code"]) == ("error", "deadline_exceeded")
    assert "queue" in reply["message"]
    async with httpx.AsyncClient(base_url=server.http_url, timeout=30) as http:
        response = await http.post(
            "/v1/completions",
            json={"model": "m", "prompt": "x"},
            headers={"x-yieldgate-deadline-ms": "50"},
        )
        assert response.status_code == 504
        stats = (await http.get("/stats")).json()
    assert (stats["queued"], stats["queue_abandoned_total"], stats["cancelled_total"]) == (0, 2, 0)


async def test_a_client_that_leaves_frees_its_place(serve: Any, connect: Any) -> None:
    server: ServerProcess = serve("--max-inflight", "1", "--queue", "1", "--http-port", "0")
    holder: RawClient = await connect(server)
    await hold_the_slot(holder)
    async with httpx.AsyncClient(base_url=server.http_url, timeout=30) as http:

        async def read() -> dict[str, Any]:
            stats: dict[str, Any] = (await http.get("/stats")).json()
            return stats

        # HTTP: the client goes while queued.
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: http.post("/generate", json={"inputs": "x"}))
            await stats_when(read, lambda s: s["queued"] == 1)
            full = await http.post("/generate", json={"inputs": "x"})
            assert full.status_code == 429  # the TGI route refuses as it always did
            assert full.json()["error_type"] == "overloaded"
            tg.cancel_scope.cancel()
        await stats_when(read, lambda s: s["queued"] == 0)

        # TCP: the connection ends while queued; then a cancel frame for a queued one.
        leaving: RawClient = await RawClient.connect(server)
        await leaving.send(submit("q", params=QUICK))
        await stats_when(read, lambda s: s["queued"] == 1)
        await leaving.aclose()
        await stats_when(read, lambda s: s["queued"] == 0)
        await holder.send(submit("q2", params=QUICK))
        await stats_when(read, lambda s: s["queued"] == 1)
        await holder.send(cancel_frame("q2"))
        reply = await holder.recv_for("q2")
        assert (reply["status"], reply["code"]) == ("error", "cancelled")
        stats = await stats_when(read, lambda s: s["queued"] == 0)
    assert stats["queue_abandoned_total"] == 3
    assert (stats["inflight"], stats["cancelled_total"]) == (1, 0)


async def test_unbounded_queue_serves_everyone(serve: Any, connect: Any) -> None:
    server: ServerProcess = serve("--max-inflight", "2", "--queue", "unbounded", "--exec-ms", "2")
    client: RawClient = await connect(server)
    ids = [client.next_id() for _ in range(50)]
    for rid in ids:
        await client.send(submit(rid, params=QUICK))
    replies = [await client.recv_for(rid, timeout=30) for rid in ids]
    assert {r["status"] for r in replies} == {"ok"}
    stats = await client.stats()
    assert stats["max_queued"] is None
    assert (stats["yielded_total"], stats["executed_total"], stats["queued"]) == (0, 50, 0)
    assert stats["queued_peak"] >= 1


async def test_queue_metrics(serve: Any, connect: Any) -> None:
    server: ServerProcess = serve("--max-inflight", "1", "--queue", "3", "--http-port", "0")
    client: RawClient = await connect(server)
    held = await hold_the_slot(client)
    queued = client.next_id()
    await client.send(submit(queued, params=QUICK))
    await client.stats_when(lambda s: s["queued"] == 1)
    async with httpx.AsyncClient(base_url=server.http_url, timeout=30) as http:
        text = (await http.get("/metrics")).text
        assert "yieldgate_queued 1.0" in text
        assert "yieldgate_max_queued 3.0" in text
        await client.send(cancel_frame(held))
        assert (await client.recv_for(queued))["status"] == "ok"
        text = (await http.get("/metrics")).text
    assert "yieldgate_queued 0.0" in text
    assert "yieldgate_queued_peak 1.0" in text
    assert "yieldgate_queue_entered_total 1.0" in text
    assert 'yieldgate_queue_wait_seconds_bucket{le="+Inf"} 1.0' in text
    assert "yieldgate_queue_wait_seconds_count 1.0" in text
