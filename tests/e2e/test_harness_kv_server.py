"""``yieldgate serve --backend harness --host-kv-blocks N --kv-dtype int8``, end to end.

A device pool too small for the requests in flight: the server pages sequences
out to its host tier, the answers are the ones an engine with room for
everything gives, and the tier's counters reach ``stats`` and ``/metrics``.
"""

from __future__ import annotations

from typing import Any

import anyio
import httpx
import pytest

import yieldgate
from yieldgate.server import ServerStartError, spawn

torch = pytest.importorskip("torch")

from yieldgate.harness.engine import Engine, EngineConfig  # noqa: E402 - needs torch
from yieldgate.harness.sequence import SamplingParams  # noqa: E402

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

# Short prompts are admitted whenever they arrive (one block each); each then
# grows to 7 or 8 blocks, so any two of them in flight overflow the 12-block pool.
PROMPTS = ["Hi", "quick brown fox", "0123456789", "paging"]
MAX_TOKENS = 100


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


async def test_a_small_pool_pages_out_and_answers_as_a_large_one() -> None:
    expected = Engine(EngineConfig(device="cpu", num_blocks=256, kv_dtype="int8")).generate(
        [list(p.encode()) for p in PROMPTS], SamplingParams(max_tokens=MAX_TOKENS)
    )
    with spawn(
        "--backend",
        "harness",
        "--max-inflight",
        "4",
        "--kv-blocks",
        "12",  # the warm-up needs 10
        "--host-kv-blocks",
        "32",
        "--kv-dtype",
        "int8",
        "--http-port",
        "0",
        ready_timeout=60,
    ) as server:
        results: dict[int, dict[str, Any]] = {}
        async with yieldgate.GovernedClient(server.url) as client:

            async def one(i: int) -> None:
                results[i] = await client.submit(
                    PROMPTS[i], params={"max_tokens": MAX_TOKENS}, timeout=60
                )

            with anyio.fail_after(120):
                async with anyio.create_task_group() as tg:
                    for i in range(len(PROMPTS)):
                        tg.start_soon(one, i)
        assert [results[i]["token_ids"] for i in range(len(PROMPTS))] == expected
        assert server.http_url is not None
        async with httpx.AsyncClient() as http:
            stats = (await http.get(f"{server.http_url}/stats")).json()["backend"]
            metrics = (await http.get(f"{server.http_url}/metrics")).text
    assert stats["kv_dtype"] == "int8"
    assert stats["kv_host_blocks_total"] == 32
    assert stats["kv_swap_outs"] > 0, stats
    assert stats["kv_blocks_in"] == stats["kv_blocks_out"] > 0
    assert "yieldgate_backend_kv_swap_outs" in metrics
    assert "yieldgate_backend_kv_bytes_out" in metrics


def test_the_cli_refuses_a_negative_host_tier() -> None:
    with pytest.raises(ServerStartError, match="--host-kv-blocks") as caught:
        spawn("--backend", "harness", "--host-kv-blocks", "-1", ready_timeout=30)
    assert caught.value.returncode == 2
