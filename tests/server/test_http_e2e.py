"""The HTTP fronts in a real ``yieldgate serve --port 0 --http-port 0`` process."""

from __future__ import annotations

import signal
from typing import Any

import anyio
import httpx
import pytest

from tests.conftest import RawClient, ServerProcess, submit

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]


async def wait_for(http: httpx.AsyncClient, predicate: Any, timeout: float = 5.0) -> dict[str, Any]:
    """Poll ``GET /stats`` until ``predicate(stats)`` holds."""
    with anyio.fail_after(timeout):
        while True:
            stats: dict[str, Any] = (await http.get("/stats")).json()
            if predicate(stats):
                return stats
            await anyio.sleep(0.02)


async def test_tcp_and_http_clients_share_the_slots(serve: Any, connect: Any) -> None:
    server: ServerProcess = serve("--max-inflight", "1", "--http-port", "0", "--exec-ms", "5")
    assert server.http_url is not None
    tcp: RawClient = await connect(server)
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        await tcp.send(submit("hold", params={"exec_ms": 30_000}))
        await wait_for(http, lambda s: s["inflight"] == 1)
        yielded = await http.post("/v1/completions", json={"model": "m", "prompt": "x"})
        assert yielded.status_code == 429
        assert yielded.json()["reason"] == "saturated"
        assert int(yielded.headers["retry-after-ms"]) > 0
        await tcp.aclose()  # the TCP client leaves: its slot frees
        await wait_for(http, lambda s: s["inflight"] == 0)

        other: RawClient = await connect(server)
        async with anyio.create_task_group() as tg:
            body = {"inputs": "x", "parameters": {"backend_params": {"exec_ms": 30_000}}}
            tg.start_soon(lambda: http.post("/generate", json=body))
            await wait_for(http, lambda s: s["inflight"] == 1)
            reply = await other.submit("from tcp")
            assert (reply["status"], reply["inflight"], reply["max_inflight"]) == ("yield", 1, 1)
            tg.cancel_scope.cancel()  # the HTTP client leaves
        stats = await wait_for(http, lambda s: s["inflight"] == 0)
    assert (stats["yielded_total"], stats["cancelled_total"], stats["inflight_peak"]) == (2, 2, 1)
    # The TCP stats op reports the HTTP front's counters too.
    assert (await other.stats())["http_requests_total"] >= 4


async def test_sigterm_lets_http_work_finish_and_refuses_new(serve: Any) -> None:
    server: ServerProcess = serve("--http-port", "0", "--exec-ms", "400", "--grace-s", "10")
    assert server.http_url is not None
    replies: list[httpx.Response] = []
    async with (
        httpx.AsyncClient(base_url=server.http_url) as working,
        httpx.AsyncClient(base_url=server.http_url) as late,
    ):
        assert (await late.get("/health")).status_code == 200  # keeps a connection open

        async def admitted() -> None:
            replies.append(await working.post("/generate", json={"inputs": "in flight"}))

        async with anyio.create_task_group() as tg:
            tg.start_soon(admitted)
            await wait_for(late, lambda s: s["inflight"] == 1)
            server.signal(signal.SIGTERM)
            await anyio.sleep(0.2)
            refused = await late.post("/generate", json={"inputs": "too late"})
            assert refused.status_code == 503
            assert refused.json()["code"] == "shutting_down"
            health = await late.get("/health")
            assert (health.status_code, health.json()) == (503, {"status": "shutting_down"})
        with pytest.raises(httpx.ConnectError):
            async with httpx.AsyncClient(base_url=server.http_url) as fresh:
                await fresh.get("/health")  # no longer accepting
    assert replies[0].status_code == 200
    assert replies[0].json() == {"generated_text": "in flight"}
    assert await anyio.to_thread.run_sync(server.wait) == 0


async def test_past_grace_http_work_is_answered_and_the_process_exits(serve: Any) -> None:
    server: ServerProcess = serve("--http-port", "0", "--exec-ms", "60000", "--grace-s", "0.3")
    assert server.http_url is not None
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        replies: list[httpx.Response] = []

        async def forever() -> None:
            replies.append(await http.post("/v1/completions", json={"model": "m", "prompt": "x"}))

        async with anyio.create_task_group() as tg:
            tg.start_soon(forever)
            await wait_for(http, lambda s: s["inflight"] == 1)
            server.signal(signal.SIGTERM)
    assert replies[0].status_code == 503
    assert replies[0].json()["error"]["code"] == "shutting_down"
    assert await anyio.to_thread.run_sync(server.wait) == 0
