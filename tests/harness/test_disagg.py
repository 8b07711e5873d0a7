"""Disaggregated prefill with real prefill worker processes (gloo on CPU).

Each backend here starts its workers as processes, so the fixtures are
shared per module where the tests allow it.
"""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
import torch

from yieldgate.harness.backend import HarnessBackend, HarnessConfig
from yieldgate.harness.engine import EngineConfig
from yieldgate.harness.router import RouterConfig
from yieldgate.server.backends import Work
from yieldgate.server.governor import Governor, GovernorConfig

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

ROUTER = RouterConfig(prefill_length_threshold=40, busy_length_threshold=40)
SHORT = "short prompt"
LONG = "a long prompt that goes to a prefill worker because it has many tokens. " * 3
OTHER_LONG = "another long prompt, different from the first one in every block it has. " * 3


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


async def started(**overrides: Any) -> HarnessBackend:
    config = HarnessConfig(
        engine=overrides.pop("engine", EngineConfig(device="cpu", num_blocks=256)),
        prefill_workers=overrides.pop("prefill_workers", 2),
        router=overrides.pop("router", ROUTER),
        worker_timeout_s=60,
        **overrides,
    )
    backend = HarnessBackend(config)
    await backend.start(Governor(GovernorConfig(max_inflight=8)))
    return backend


@pytest.fixture(scope="module")
async def backend() -> AsyncIterator[HarnessBackend]:
    harness = await started()
    try:
        yield harness
    finally:
        await harness.aclose()


async def generate(backend: HarnessBackend, prompts: list[str], max_tokens: int = 10) -> list[str]:
    texts: dict[int, str] = {}

    async def one(i: int) -> None:
        work = Work(id=str(i), body=prompts[i], params={"max_tokens": max_tokens})
        texts[i] = (await backend.execute(work, None))["text"]

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            for i in range(len(prompts)):
                tg.start_soon(one, i)
    return [texts[i] for i in range(len(prompts))]


def reference(backend: HarnessBackend, prompt: str, max_tokens: int = 10) -> str:
    assert backend.engine is not None
    out = backend.engine.model.greedy_reference(list(prompt.encode()), max_tokens)
    return bytes(out).decode("utf-8", errors="replace")


async def test_greedy_outputs_are_identical_on_every_path(backend: HarnessBackend) -> None:
    before = backend.stats()
    prompts = [SHORT, LONG, OTHER_LONG, SHORT + "!"]
    texts = await generate(backend, prompts)
    # Colocated (the engine's own reference: a full forward per token), local
    # prefill (short prompts) and remote prefill (long ones) agree token for token.
    assert texts == [reference(backend, prompt) for prompt in prompts]
    after = backend.stats()
    assert after["remote_prefills"] - before["remote_prefills"] == 2
    assert after["local_prefills"] - before["local_prefills"] == 2
    workers = after["prefill_workers"]
    assert sum(w["transfers"] for w in workers) >= 2
    assert all(w["checksum_failures"] == 0 for w in workers)
    assert after["transfer_bytes_total"] > 0
    assert after["kv_blocks_used"] == 0


async def test_a_remote_prefill_gives_the_first_token_its_logprob_too(
    backend: HarnessBackend,
) -> None:
    prompt = "a long prompt that no other test sends, so no cache holds any of it. " * 3
    before = backend.stats()["remote_prefills"]
    params = {"max_tokens": 4, "logprobs": 1}
    with anyio.fail_after(60):
        remote = await backend.execute(Work(id="r", body=prompt, params=params), None)
    assert backend.stats()["remote_prefills"] == before + 1
    assert backend.engine is not None
    # The decode worker computes the prompt's last position, so the first token's
    # log-probability is its own, and equals a full forward pass's.
    tokens = list(prompt.encode()) + remote["token_ids"]
    logits = backend.engine.model.forward_full(torch.tensor(tokens[:-1]))
    expected = torch.log_softmax(logits[-4:].float(), dim=-1)
    for row, entry in zip(expected, remote["logprobs"], strict=True):
        assert entry["logprob"] == pytest.approx(float(row[entry["id"]]), abs=1e-4)


async def test_routing_decisions_show_in_stats(backend: HarnessBackend) -> None:
    before = backend.stats()["router"]["decisions"]
    fresh = "routing test: a prompt never seen before, long enough to offload. " * 3
    await generate(backend, [fresh + "first"])
    # Same long prefix, now cached on the decode worker: only the tail is new.
    await generate(backend, [fresh + "second"])
    await generate(backend, ["tiny"])
    after = backend.stats()["router"]["decisions"]
    assert after["long"] - before["long"] == 1
    assert after["prefix_hit"] - before["prefix_hit"] == 1
    assert after["short"] - before["short"] == 1


async def test_serving_metrics_are_reported(backend: HarnessBackend) -> None:
    await generate(backend, [LONG, SHORT])
    serving = backend.stats()["serving"]
    assert serving["requests"] >= 2
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "transfer_ms"):
        assert set(serving[key]) >= {"p50", "p95", "p99"}
        assert serving[key]["p50"] is not None
    assert 0 < serving["offload_ratio"] < 1


async def test_a_corrupted_transfer_is_caught_and_sent_again() -> None:
    harness = await started(prefill_workers=1, corrupt_transfers=1)
    try:
        texts = await generate(harness, [LONG])
        assert texts == [reference(harness, LONG)]
        worker = harness.stats()["prefill_workers"][0]
        assert worker["checksum_failures"] == 1
        assert worker["transfers"] == 1
    finally:
        await harness.aclose()


async def test_a_dead_prefill_worker_costs_no_request() -> None:
    harness = await started(prefill_workers=1)
    try:
        pid = harness.stats()["prefill_workers"][0]["pid"]
        prompts = [f"{i}: {LONG}" for i in range(6)]
        texts: dict[int, str] = {}

        async def one(i: int) -> None:
            work = Work(id=str(i), body=prompts[i], params={"max_tokens": 8})
            texts[i] = (await harness.execute(work, None))["text"]

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for i in range(len(prompts)):
                    tg.start_soon(one, i)
                # Kill the worker while it has prompts assigned.
                while harness.stats()["prefill_queue"] == 0:  # noqa: ASYNC110
                    await anyio.sleep(0.001)
                os.kill(pid, signal.SIGKILL)
        assert [texts[i] for i in range(6)] == [reference(harness, p, 8) for p in prompts]
        stats = harness.stats()
        assert stats["prefill_workers_dead"] == 1
        assert stats["prefill_fallbacks"] >= 1
        assert stats["prefill_workers"][0]["alive"] is False
        # The decode worker goes on serving, routing long prompts locally now.
        assert await generate(harness, [OTHER_LONG]) == [reference(harness, OTHER_LONG)]
        assert stats["kv_blocks_used"] == 0
    finally:
        await harness.aclose()


async def test_a_bfloat16_prefill_worker_sends_its_kv_in_bfloat16() -> None:
    from yieldgate.harness.engine import Engine
    from yieldgate.harness.sequence import SamplingParams

    engine = EngineConfig(device="cpu", num_blocks=256, dtype="bfloat16")
    harness = await started(prefill_workers=1, engine=engine)
    try:
        texts = await generate(harness, [LONG, OTHER_LONG])
        stats = harness.stats()
    finally:
        await harness.aclose()
    # The worker ran the decode worker's dtype: 2 bytes a value, every byte checked.
    assert stats["remote_prefills"] == 2
    worker = stats["prefill_workers"][0]
    assert worker["transfers"] >= 2
    assert worker["checksum_failures"] == 0
    cfg = engine.model
    per_token = 2 * cfg.n_layers * cfg.d_model * 2  # keys and values, bfloat16
    prompt_tokens = len(LONG.encode()) - 1 + len(OTHER_LONG.encode()) - 1
    assert stats["transfer_bytes_total"] == per_token * prompt_tokens
    # And the outputs are a bfloat16 engine's, prefilled on the spot.
    local = Engine(engine).generate(
        [list(LONG.encode()), list(OTHER_LONG.encode())], SamplingParams(max_tokens=10)
    )
    assert texts == [bytes(out).decode("utf-8", errors="replace") for out in local]
