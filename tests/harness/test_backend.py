"""The harness backend in-process: cold start, results, streams, cancellation, bad input."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from yieldgate.harness.backend import HarnessBackend, HarnessConfig
from yieldgate.harness.engine import EngineConfig
from yieldgate.harness.qos import EngineLoad
from yieldgate.harness.scheduler import SchedulerConfig
from yieldgate.server.backends import BackendError, Work
from yieldgate.server.governor import Governor, GovernorConfig

pytestmark = pytest.mark.anyio


@pytest.fixture
async def backend() -> AsyncIterator[HarnessBackend]:
    harness = HarnessBackend(HarnessConfig(engine=EngineConfig(device="cpu", num_blocks=128)))
    governor = Governor(GovernorConfig(max_inflight=4))
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(harness.start, governor)
            # The cold start is declared before the first await: no request gets in first.
            await anyio.lowlevel.checkpoint()
            assert governor.is_cold
            assert governor.refuse() is not None
        assert not governor.is_cold
        yield harness
    finally:
        await harness.aclose()


def work(body: str, **params: Any) -> Work:
    return Work(id="r", body=body, params=params, stream=False)


async def test_results_carry_text_counts_and_timings(backend: HarnessBackend) -> None:
    result = await backend.execute(work("Hello there", max_tokens=12), None)
    assert result["completion_tokens"] == 12
    assert result["prompt_tokens"] == len(b"Hello there")
    assert result["ttft_ms"] > 0
    assert result["tpot_ms"] > 0
    assert result["e2e_ms"] >= result["ttft_ms"]
    assert result["finish_reason"] == "length"
    assert backend.engine is not None
    expected = backend.engine.model.greedy_reference(list(b"Hello there"), 12)
    assert result["text"] == bytes(expected).decode("utf-8", errors="replace")


async def test_a_stream_sends_the_text_in_pieces(backend: HarnessBackend) -> None:
    chunks: list[Any] = []

    async def emit(data: Any) -> None:
        chunks.append(data)

    result = await backend.execute(
        Work(id="s", body="Stream me", params={"max_tokens": 10}, stream=True), emit
    )
    assert len(chunks) >= 2
    assert "".join(chunk["text"] for chunk in chunks) == result["text"]
    assert sum(len(chunk["token_ids"]) for chunk in chunks) <= 10


async def test_logprobs_come_with_the_result_and_with_each_chunk(
    backend: HarnessBackend,
) -> None:
    chunks: list[Any] = []

    async def emit(data: Any) -> None:
        chunks.append(data)

    params = {"max_tokens": 8, "logprobs": 2}
    streamed = await backend.execute(Work(id="s", body="Hi", params=params, stream=True), emit)
    whole = await backend.execute(work("Hi", **params), None)
    entries = whole["logprobs"]
    assert [entry["id"] for entry in entries] == whole["token_ids"]
    assert all(len(entry["top"]) == 2 for entry in entries)
    # Greedy: the chosen token is the most likely one.
    assert all(entry["top"][0]["id"] == entry["id"] for entry in entries)
    assert streamed["logprobs"] == entries
    assert [chunk["logprobs"] for chunk in chunks] == [[entry] for entry in entries]
    assert backend.features == {"logprobs", "top_p"}
    plain = await backend.execute(work("Hi", max_tokens=8), None)
    assert "logprobs" not in plain


async def test_concurrent_requests_share_decode_steps(backend: HarnessBackend) -> None:
    results: list[Any] = []

    async def one(i: int) -> None:
        results.append(await backend.execute(work(f"prompt number {i}", max_tokens=20), None))

    async with anyio.create_task_group() as tg:
        for i in range(4):
            tg.start_soon(one, i)
    stats = backend.stats()
    assert stats["tokens_generated"] == 80
    # Four sequences of 20 tokens in far fewer than 80 decode steps: they were batched.
    assert stats["decode_steps"] < 40


async def test_a_cancelled_request_frees_its_sequence(backend: HarnessBackend) -> None:
    got_first = anyio.Event()

    async def emit(data: Any) -> None:
        got_first.set()

    async with anyio.create_task_group() as tg:

        async def long_stream() -> None:
            await backend.execute(
                Work(id="c", body="cancel me", params={"max_tokens": 500}, stream=True), emit
            )

        tg.start_soon(long_stream)
        await got_first.wait()
        assert backend.stats()["running"] == 1
        tg.cancel_scope.cancel()
    with anyio.fail_after(5):
        while backend.stats()["running"] or backend.stats()["kv_blocks_used"]:  # noqa: ASYNC110
            await anyio.sleep(0.01)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": "12"}, "max_tokens"),
        ({"temperature": -1}, "temperature"),
        ({"temperature": True}, "temperature"),
        ({"seed": 1.5}, "seed"),
        ({"max_tokens": 5000}, "positions"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": "0.5"}, "top_p"),
        ({"logprobs": 21}, "logprobs"),
        ({"logprobs": True}, "logprobs"),
    ],
)
async def test_bad_parameters_are_refused_before_admission(
    backend: HarnessBackend, params: dict[str, Any], message: str
) -> None:
    with pytest.raises(BackendError, match=message) as info:
        backend.estimate_ms(work("hi", **params))
    assert not info.value.retryable


async def test_an_empty_prompt_is_refused(backend: HarnessBackend) -> None:
    with pytest.raises(BackendError, match="empty"):
        backend.estimate_ms(work(""))


async def test_estimates_come_from_measured_step_times(backend: HarnessBackend) -> None:
    short = backend.estimate_ms(work("x", max_tokens=2))
    long = backend.estimate_ms(work("x" * 500, max_tokens=200))
    assert short is not None
    assert long is not None
    assert 0 < short < long


async def test_estimates_count_the_decode_steps_swapped_sequences_hold_a_request_back(
    backend: HarnessBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 32: with sequences swapped out, a request waits for them first. The
    # engine thread publishes those steps; an idle engine publishes nothing new here.
    assert backend.engine is not None
    step_ms = backend.engine.decode_step_ms
    assert step_ms is not None
    base = backend.estimate_ms(work("x", max_tokens=2))
    assert base is not None
    monkeypatch.setattr(backend, "_load_now", EngineLoad(steps_ahead=50))
    assert backend.estimate_ms(work("x", max_tokens=2)) == pytest.approx(base + 50 * step_ms)


async def test_estimates_count_the_decode_steps_between_a_local_prompts_pieces(
    backend: HarnessBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = backend.engine
    assert engine is not None
    chunked = dataclasses.replace(engine.scheduler.config, prefill_chunk=16)
    monkeypatch.setattr(engine.scheduler, "config", chunked)
    monkeypatch.setattr(engine, "prefill_ms_per_token", 0.5)
    monkeypatch.setattr(engine, "decode_step_ms", 3.0)
    prompt = work("x" * 64, max_tokens=1)
    assert backend.estimate_ms(prompt) == 64 * 0.5  # nothing decodes: one piece after another
    monkeypatch.setattr(backend, "_load_now", EngineLoad(running=2))
    assert backend.estimate_ms(prompt) == 64 * 0.5 + 3 * 3.0
    # With prefill workers (the engine's own queue published apart), no pieces counted.
    monkeypatch.setattr(backend, "_load_now", EngineLoad(running=2, local_ahead=(0, 0, 0)))
    assert backend.estimate_ms(prompt) == 64 * 0.5


async def test_execute_after_close_is_a_retryable_error() -> None:
    harness = HarnessBackend(HarnessConfig(engine=EngineConfig(device="cpu", num_blocks=16)))
    with pytest.raises(BackendError, match="not running") as info:
        await harness.execute(work("hi"), None)
    assert info.value.retryable
    await harness.aclose()


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="default_max_tokens"):
        HarnessConfig(default_max_tokens=0)
    with pytest.raises(ValueError, match="torch_threads"):
        HarnessConfig(torch_threads=0)
    with pytest.raises(ValueError, match="device"):
        EngineConfig(device="tpu")
    with pytest.raises(ValueError, match="raise --kv-blocks"):
        HarnessConfig(engine=EngineConfig(num_blocks=2, block_size=4))


async def test_a_small_cache_warms_up_with_a_prompt_it_can_hold() -> None:
    # 8 blocks of 16 tokens: less than the full warm-up prompt and its tokens need.
    harness = HarnessBackend(HarnessConfig(engine=EngineConfig(device="cpu", num_blocks=8)))
    try:
        await harness.start(Governor(GovernorConfig(max_inflight=2)))
        assert harness.engine is not None
        assert harness.engine.decode_step_ms is not None  # it warmed up
    finally:
        await harness.aclose()


async def test_a_failing_step_fails_its_requests_and_the_engine_goes_on(
    backend: HarnessBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert backend.engine is not None
    runner = backend.engine.runner
    real_run = runner.run
    calls = 0

    def flaky(batch: Any) -> list[int]:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise RuntimeError("device fell over")
        return real_run(batch)

    monkeypatch.setattr(runner, "run", flaky)
    with pytest.raises(BackendError, match="device fell over") as info:
        await backend.execute(work("doomed", max_tokens=10), None)
    assert info.value.retryable
    assert backend.stats()["kv_blocks_used"] == 0
    result = await backend.execute(work("fine", max_tokens=3), None)
    assert result["completion_tokens"] == 3


async def test_the_governor_admits_no_more_than_the_engine_runs() -> None:
    harness = HarnessBackend(
        HarnessConfig(
            engine=EngineConfig(
                device="cpu", num_blocks=16, scheduler=SchedulerConfig(max_num_seqs=3)
            )
        )
    )
    governor = Governor(GovernorConfig(max_inflight=8))
    try:
        await harness.start(governor)
        assert governor.capacity == 3
    finally:
        await harness.aclose()


async def test_a_failure_while_placing_a_request_fails_only_that_request(
    backend: HarnessBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert backend.engine is not None
    scheduler = backend.engine.scheduler
    real_add = scheduler.add
    calls = 0

    def flaky(seq: Any) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("placement bug")
        real_add(seq)

    monkeypatch.setattr(scheduler, "add", flaky)
    with pytest.raises(BackendError, match="placement bug"):
        await backend.execute(work("first", max_tokens=3), None)
    result = await backend.execute(work("second", max_tokens=3), None)
    assert result["completion_tokens"] == 3


async def test_a_stop_sequence_that_ends_the_generation_is_named(backend: HarnessBackend) -> None:
    assert backend.engine is not None
    greedy = bytes(backend.engine.model.greedy_reference(list(b"Hello there"), 12))
    text = greedy.decode("utf-8", errors="replace")
    stop = text[3:5]  # two characters of what it will generate, after the third
    result = await backend.execute(work("Hello there", max_tokens=12, stop=[stop, "\x00"]), None)
    assert result["finish_reason"] == "stop_sequence"
    assert result["stop_sequence"] == stop
    assert result["text"] == text[: text.index(stop)]
