"""A prefill worker's KV pool is sized to the prompts it prefills, not to the decode worker's pool.

The end-to-end tests start one real prefill worker process (gloo on CPU),
shared by the module.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from yieldgate.harness.backend import HarnessBackend, HarnessConfig
from yieldgate.harness.engine import Engine, EngineConfig
from yieldgate.harness.prefill_worker import WorkerSpec, prefill_worker_blocks
from yieldgate.harness.router import RouterConfig
from yieldgate.harness.scheduler import SchedulerConfig
from yieldgate.harness.sequence import SamplingParams
from yieldgate.server.backends import BackendError, Work
from yieldgate.server.governor import Governor, GovernorConfig

# The longest prompt the engine takes is 200 tokens (bytes): 199 for a worker
# to compute, 13 blocks of 16, so 26 blocks with its prefix cache, of 256.
LONGEST = 200
ENGINE = EngineConfig(
    device="cpu", num_blocks=256, scheduler=SchedulerConfig(max_num_batched_tokens=LONGEST)
)
WORKER_BLOCKS = 26


def prompt_of(length: int, tag: str) -> str:
    """An ASCII prompt of exactly ``length`` bytes, different from others from its first block."""
    text = f"{tag}: a long prompt for a prefill worker, sized to the byte. " * 8
    assert len(text) >= length
    return text[:length]


def test_the_rule_one_batch_and_as_many_again_for_the_prefix_cache() -> None:
    assert prefill_worker_blocks(LONGEST, 16, 256) == WORKER_BLOCKS
    # The decode worker computes a prompt's last token: 17 tokens need one block here.
    assert prefill_worker_blocks(17, 16, 256) == 2
    assert prefill_worker_blocks(18, 16, 256) == 4
    assert prefill_worker_blocks(1, 16, 256) == 2
    assert prefill_worker_blocks(2048, 16, 100) == 100  # never more than the decode pool
    for bad in ((0, 16, 256), (200, 0, 256), (200, 16, 0)):
        with pytest.raises(ValueError, match="must be >= 1"):
            prefill_worker_blocks(*bad)


def test_the_default_worker_allocates_a_quarter_of_the_decode_pool() -> None:
    config = HarnessConfig()
    spec = config.worker_spec(2048)  # the default engine's longest prompt
    assert config.engine.num_blocks == 1024
    assert spec.num_blocks == 256
    # What the worker process builds its engine from.
    assert spec.engine_config().num_blocks == 256


def test_the_longest_prompt_the_engine_accepts_is_what_sizes_the_worker() -> None:
    engine = Engine(ENGINE)
    assert engine.max_prompt_tokens == LONGEST
    engine.check(LONGEST, SamplingParams(max_tokens=1))
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        engine.check(LONGEST + 1, SamplingParams(max_tokens=1))
    short_model = dataclasses.replace(
        ENGINE, model=dataclasses.replace(ENGINE.model, max_seq_len=64)
    )
    assert Engine(short_model).max_prompt_tokens == 64
    spec = HarnessConfig(engine=ENGINE).worker_spec(engine.max_prompt_tokens)
    assert spec.num_blocks == WORKER_BLOCKS
    assert spec.holds(LONGEST)


def test_holds_is_exact_to_the_token() -> None:
    spec = dataclasses.replace(HarnessConfig().worker_spec(2048), num_blocks=12, block_size=16)
    assert isinstance(spec, WorkerSpec)
    assert spec.holds(12 * 16 + 1)  # 192 tokens to compute: 12 blocks
    assert not spec.holds(12 * 16 + 2)


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def backend() -> AsyncIterator[HarnessBackend]:
    config = HarnessConfig(
        engine=ENGINE,
        prefill_workers=1,
        router=RouterConfig(prefill_length_threshold=40, busy_length_threshold=40),
        worker_timeout_s=60,
    )
    harness = HarnessBackend(config)
    await harness.start(Governor(GovernorConfig(max_inflight=4)))
    try:
        yield harness
    finally:
        await harness.aclose()


@pytest.fixture(scope="module")
def local() -> Engine:
    """An engine of the same model that prefills everything itself."""
    return Engine(ENGINE)


async def run(backend: HarnessBackend, prompt: str, max_tokens: int = 8) -> dict[str, Any]:
    work = Work(id=prompt[:8], body=prompt, params={"max_tokens": max_tokens})
    with anyio.fail_after(60):
        result: dict[str, Any] = await backend.execute(work, None)
    return result


def local_tokens(engine: Engine, prompt: str, max_tokens: int = 8) -> list[int]:
    return engine.generate([list(prompt.encode())], SamplingParams(max_tokens=max_tokens))[0]


@pytest.mark.anyio
@pytest.mark.e2e
async def test_the_worker_process_allocates_the_computed_pool(backend: HarnessBackend) -> None:
    (worker,) = backend.stats()["prefill_workers"]
    assert worker["kv_blocks"] == WORKER_BLOCKS  # not the decode worker's 256


@pytest.mark.anyio
@pytest.mark.e2e
async def test_the_longest_prompt_prefills_remotely_with_the_output_of_a_local_prefill(
    backend: HarnessBackend, local: Engine
) -> None:
    prompt = prompt_of(LONGEST, "longest")
    before = backend.stats()
    result = await run(backend, prompt)
    after = backend.stats()
    assert after["remote_prefills"] == before["remote_prefills"] + 1
    assert after["prefill_fallbacks"] == before["prefill_fallbacks"]
    assert after["prefill_workers"][0]["transfers"] == before["prefill_workers"][0]["transfers"] + 1
    assert result["token_ids"] == local_tokens(local, prompt)
    assert after["kv_blocks_used"] == 0


@pytest.mark.anyio
@pytest.mark.e2e
async def test_a_prompt_one_token_too_long_never_reaches_a_worker(backend: HarnessBackend) -> None:
    before = backend.stats()["prefill_workers"][0]["jobs_total"]
    with pytest.raises(BackendError, match="max_num_batched_tokens") as info:
        await run(backend, prompt_of(LONGEST + 1, "too long"))
    assert not info.value.retryable
    assert backend.stats()["prefill_workers"][0]["jobs_total"] == before


@pytest.mark.anyio
@pytest.mark.e2e
async def test_a_prompt_longer_than_the_worker_pool_is_prefilled_here(
    backend: HarnessBackend, local: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A spec not sized by the engine's longest prompt: 12 blocks hold 193-token prompts.
    assert backend.disagg is not None
    pool = backend.disagg.pool
    monkeypatch.setattr(pool, "spec", dataclasses.replace(pool.spec, num_blocks=12))
    fits, too_long = prompt_of(193, "fits"), prompt_of(194, "one more")
    before = backend.stats()
    results = [await run(backend, fits), await run(backend, too_long)]
    after = backend.stats()
    assert after["remote_prefills"] == before["remote_prefills"] + 1  # ``fits`` only
    assert after["prefill_fallbacks"] == before["prefill_fallbacks"] + 1
    assert after["local_prefills"] == before["local_prefills"] + 1
    jobs = after["prefill_workers"][0]["jobs_total"] - before["prefill_workers"][0]["jobs_total"]
    assert jobs == 1
    assert [r["token_ids"] for r in results] == [
        local_tokens(local, fits),
        local_tokens(local, too_long),
    ]
    assert after["kv_blocks_used"] == 0
