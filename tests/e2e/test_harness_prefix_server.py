"""``yieldgate serve --backend harness --host-prefix-blocks N``, end to end.

A shared prefix, other traffic that evicts it from a small device pool, the
prefix again: the server pages it back from its prefix tier, answers as an
engine that never evicted, and the tier's counters reach ``stats`` and ``/metrics``.
"""

from __future__ import annotations

import anyio
import httpx
import pytest

import yieldgate
from yieldgate.server import ServerStartError, spawn

torch = pytest.importorskip("torch")

from yieldgate.harness.engine import Engine, EngineConfig  # noqa: E402 - needs torch
from yieldgate.harness.sequence import SamplingParams  # noqa: E402

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

SHARED = ("You are a careful assistant; answer from the manual. " * 2)[:96]  # six blocks
PROMPTS = [
    SHARED + "What is a block table?",
    *(f"{i}: other traffic, not shared. " * 4 for i in range(5)),
    SHARED + "How are blocks evicted, and when?",
]
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


async def test_an_evicted_prefix_is_paged_back_and_answers_as_if_never_evicted() -> None:
    params = SamplingParams(max_tokens=MAX_TOKENS)
    engine = Engine(EngineConfig(device="cpu", num_blocks=512))
    expected = [engine.generate([list(p.encode())], params)[0] for p in PROMPTS]
    with spawn(
        "--backend",
        "harness",
        "--kv-blocks",
        "24",
        "--host-prefix-blocks",
        "64",
        "--http-port",
        "0",
        ready_timeout=60,
    ) as server:
        answers = []
        async with yieldgate.GovernedClient(server.url) as client:
            with anyio.fail_after(120):
                for prompt in PROMPTS:  # one at a time: the others evict the prefix
                    result = await client.submit(
                        prompt, params={"max_tokens": MAX_TOKENS}, timeout=60
                    )
                    answers.append(result["token_ids"])
        assert server.http_url is not None
        async with httpx.AsyncClient() as http:
            stats = (await http.get(f"{server.http_url}/stats")).json()["backend"]
            metrics = (await http.get(f"{server.http_url}/metrics")).text
    assert answers == expected
    assert stats["kv_prefix_host_blocks_total"] == 64
    assert stats["kv_prefix_blocks_stored"] > 0, stats
    assert stats["kv_prefix_blocks_paged_back"] >= len(SHARED) // 16, stats
    assert stats["kv_prefix_pinned"] == stats["kv_blocks_used"] == 0
    assert "yieldgate_backend_kv_prefix_blocks_paged_back" in metrics


def test_the_cli_refuses_a_negative_prefix_tier() -> None:
    with pytest.raises(ServerStartError, match="--host-prefix-blocks") as caught:
        spawn("--backend", "harness", "--host-prefix-blocks", "-1", ready_timeout=30)
    assert caught.value.returncode == 2
