"""The host KV tier: paging running sequences out and back in keeps every output the same."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

from yieldgate.harness.backend import HarnessConfig
from yieldgate.harness.disagg import Disaggregation
from yieldgate.harness.engine import Engine, EngineConfig
from yieldgate.harness.kv_tiers import HostKVTier, TieredScheduler, block_views
from yieldgate.harness.model import KVCache, ModelConfig
from yieldgate.harness.qos import QosPolicy, SloConfig, TtftEstimator
from yieldgate.harness.router import Router, RouterConfig
from yieldgate.harness.sequence import SamplingParams, SequenceStatus
from yieldgate.protocol import Priority

PROMPTS = [
    list(b"Hi"),
    list(b"The quick brown fox jumps over the lazy dog"),
    list(b"0123456789abcdef"),
    list(b"a longer prompt that spans several KV blocks of sixteen tokens each, and then some"),
]
GREEDY = SamplingParams(max_tokens=24)
SEEDED = SamplingParams(max_tokens=24, temperature=1.0, seed=11, top_p=0.9)


def make_engine(**overrides: Any) -> Engine:
    return Engine(EngineConfig(**{"device": "cpu", "num_blocks": 256, **overrides}))


def tiered(engine: Engine) -> TieredScheduler:
    assert isinstance(engine.scheduler, TieredScheduler)
    return engine.scheduler


@pytest.fixture(scope="module")
def large_pool_outputs() -> dict[tuple[str, str], list[list[int]]]:
    """What each workload gives when every sequence's KV fits the device pool."""
    out = {}
    for kv_dtype in ("float32", "int8"):
        for name, params in (("greedy", GREEDY), ("seeded", SEEDED)):
            out[kv_dtype, name] = make_engine(kv_dtype=kv_dtype).generate(PROMPTS, params)
    return out


@pytest.mark.parametrize("kv_dtype", ["float32", "int8"])
@pytest.mark.parametrize("sampling", ["greedy", "seeded"])
def test_paging_out_and_in_gives_the_outputs_of_a_large_enough_pool(
    large_pool_outputs: dict[tuple[str, str], list[list[int]]], kv_dtype: str, sampling: str
) -> None:
    # 12 blocks of 16 tokens for 4 sequences that grow to 26-108 tokens: they
    # cannot all hold their KV at once, and the host tier takes the overflow.
    engine = make_engine(num_blocks=12, host_kv_blocks=32, kv_dtype=kv_dtype)
    params = GREEDY if sampling == "greedy" else SEEDED
    assert engine.generate(PROMPTS, params) == large_pool_outputs[kv_dtype, sampling]
    stats = engine.stats()
    assert stats["kv_swap_outs"] > 0
    assert stats["kv_swap_ins"] == stats["kv_swap_outs"]
    assert stats["preemptions"] == 0  # nothing was recomputed
    assert stats["kv_blocks_in"] == stats["kv_blocks_out"] > 0
    assert stats["kv_bytes_out"] == stats["kv_blocks_out"] * engine.cache.bytes_per_block
    assert stats["kv_bytes_in"] == stats["kv_bytes_out"]
    assert stats["kv_page_out_ms"] > 0
    # Everything given back, on both tiers.
    assert stats["kv_blocks_used"] == 0
    assert stats["kv_host_blocks_used"] == 0
    assert stats["kv_swapped"] == 0
    # Paging moves KV, it does not compute it again: only the prompts were prefilled.
    assert stats["prompt_tokens_computed"] == sum(len(p) for p in PROMPTS)


def test_the_same_workload_without_a_tier_recomputes(
    large_pool_outputs: dict[tuple[str, str], list[list[int]]],
) -> None:
    engine = make_engine(num_blocks=12)
    assert engine.generate(PROMPTS, GREEDY) == large_pool_outputs["float32", "greedy"]
    stats = engine.stats()
    assert stats["preemptions"] > 0
    assert stats["prompt_tokens_computed"] > sum(len(p) for p in PROMPTS)
    assert stats["kv_swap_outs"] == stats["kv_host_blocks_total"] == 0


def test_a_host_tier_too_small_falls_back_to_recompute(
    large_pool_outputs: dict[tuple[str, str], list[list[int]]],
) -> None:
    engine = make_engine(num_blocks=12, host_kv_blocks=1)
    assert engine.generate(PROMPTS, GREEDY) == large_pool_outputs["float32", "greedy"]
    assert engine.stats()["preemptions"] > 0


def _fill_until_swapped(engine: Engine) -> list[Any]:
    seqs = [engine.add(prompt, SamplingParams(max_tokens=60)) for prompt in PROMPTS]
    scheduler = tiered(engine)
    while not scheduler.swapped:
        assert engine.step() is not None
    return seqs


def test_nothing_new_is_admitted_while_a_sequence_is_swapped_out() -> None:
    engine = make_engine(num_blocks=12, host_kv_blocks=32)
    seqs = _fill_until_swapped(engine)
    late = engine.add(list(b"late"), SamplingParams(max_tokens=2))
    for _ in range(3):
        step = engine.step()
        assert step is not None
        assert late not in step.seqs
    engine.run_until_done([*seqs, late])
    assert late.output == engine.model.greedy_reference(list(b"late"), 2)


def test_the_ttft_estimate_counts_the_steps_swapped_sequences_hold_a_new_prompt_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Issue 32: under memory pressure a new prompt waited 55 steps for its first
    # token, while early rejection priced one decode step.
    engine = make_engine(num_blocks=14, host_kv_blocks=64)
    # Every page-in lands by the next step, as if the copy thread always kept up:
    # the steps waited no longer depend on the thread's timing.
    monkeypatch.setattr(tiered(engine).tier, "is_done", lambda handle: True)
    seqs = [engine.add(prompt, SamplingParams(max_tokens=64)) for prompt in PROMPTS]
    while not tiered(engine).swapped:
        assert engine.step() is not None
    # The reading the engine thread publishes, priced at 1 ms a decode step.
    qos = QosPolicy(SloConfig(), TtftEstimator(prefill_ms_per_token=0.0, decode_step_ms=1.0))
    reading = {
        "prompt_tokens": 10,
        "queued_prefill_tokens": 0,
        "decode_running": len(engine.scheduler.running),
        "decode_steps_ahead": engine.scheduler.decode_steps_to_admit(),
    }
    estimate = qos.estimator.estimate_ms(**reading)
    late = engine.add(list(b"late"), SamplingParams(max_tokens=2))
    waited = 0
    while not late.output:
        step = engine.step()
        assert step is not None
        waited += not step.is_prefill
    assert waited > 10
    assert estimate is not None
    assert 0.9 * waited <= estimate <= waited  # a lower bound, and a close one
    assert qos.check(Priority.LOW, **reading) is None  # 500 ms: not missed
    assert qos.check(Priority.LOW, **reading | {"decode_steps_ahead": 600}) is not None
    engine.run_until_done([*seqs, late])
    stats = engine.stats()
    assert stats["kv_blocks_used"] == stats["kv_host_blocks_used"] == stats["kv_swapped"] == 0


def test_the_engine_estimate_counts_the_steps_swapped_sequences_hold_a_new_prompt_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Issue 32: Engine.estimate_ms priced the request's own steps only.
    engine = make_engine(num_blocks=14, host_kv_blocks=64)
    monkeypatch.setattr(tiered(engine).tier, "is_done", lambda handle: True)
    seqs = [engine.add(prompt, SamplingParams(max_tokens=64)) for prompt in PROMPTS]
    while not tiered(engine).swapped:
        assert engine.step() is not None
    # Priced at 1 ms a decode step and nothing for prefill: the estimate counts steps.
    monkeypatch.setattr(engine, "prefill_ms_per_token", 0.0)
    monkeypatch.setattr(engine, "decode_step_ms", 1.0)
    estimate = engine.estimate_ms(4, 2)
    # What the backend prices with: the steps the engine thread published.
    published = engine.scheduler.decode_steps_to_admit()
    assert estimate == engine.estimate_ms(4, 2, steps_ahead=published)
    assert engine.estimate_ms(4, 2, steps_ahead=0) == 1.0
    late = engine.add(list(b"late"), SamplingParams(max_tokens=2))
    waited = 0
    while not late.is_finished:
        step = engine.step()
        assert step is not None
        waited += not step.is_prefill
    assert waited > 10
    assert estimate is not None
    assert 0.9 * waited <= estimate <= waited
    engine.run_until_done(seqs)


def test_the_router_counts_swapped_sequences_as_decode_load() -> None:
    # Issue 32: the router's busy-decode rule saw only the running sequences.
    engine = make_engine(num_blocks=12, host_kv_blocks=32)
    seqs = _fill_until_swapped(engine)
    scheduler = tiered(engine)
    assert scheduler.num_decoding == len(scheduler.running) + scheduler.num_swapped
    busy = RouterConfig(
        prefill_length_threshold=1000,
        busy_length_threshold=8,
        decode_busy_running=len(scheduler.running) + 1,
    )
    spec = HarnessConfig(engine=engine.config).worker_spec(engine.max_prompt_tokens)
    disagg = Disaggregation(engine, Router(busy), 0, spec, post=print)
    prompt = engine.create(list(b"a middling prompt"), SamplingParams(max_tokens=2))
    # Busy: it would go to a prefill worker, were there one.
    assert disagg.route(prompt).reason == "no_worker"
    engine.run_until_done(seqs)
    assert scheduler.num_decoding == 0
    assert disagg.route(prompt).reason == "short"


def test_no_prefill_worker_reservation_while_a_sequence_is_swapped_out() -> None:
    engine = make_engine(num_blocks=12, host_kv_blocks=32)
    seqs = _fill_until_swapped(engine)
    remote = engine.create(list(b"for a prefill worker"), SamplingParams(max_tokens=2))
    assert not engine.reserve_remote(remote)  # swapped sequences come back first
    engine.run_until_done(seqs)
    assert engine.reserve_remote(remote)
    engine.abort(remote)


def test_page_ins_start_when_a_step_frees_blocks_before_the_next_step() -> None:
    engine = make_engine(num_blocks=8, host_kv_blocks=32)
    seqs = [
        engine.add(prompt, SamplingParams(max_tokens=n))
        for prompt, n in zip(PROMPTS, (40, 40, 40, 20), strict=True)
    ]
    scheduler = tiered(engine)
    prefetched = 0
    while not all(seq.is_finished for seq in seqs):
        result = engine.step()
        assert result is not None
        if result.finished and scheduler.incoming:
            # The page-in was issued by the step that freed the blocks (prefetch),
            # not by the schedule of the step that needs it.
            prefetched += 1
    assert prefetched > 0
    assert scheduler.num_swap_ins == scheduler.num_swap_outs > 0


def test_aborting_swapped_and_incoming_sequences_frees_both_tiers() -> None:
    engine = make_engine(num_blocks=12, host_kv_blocks=32)
    seqs = _fill_until_swapped(engine)
    scheduler = tiered(engine)
    victim = scheduler.swapped[0].seq
    assert victim.status is SequenceStatus.SWAPPED
    engine.abort(victim)  # swapped out: its host blocks go back
    assert victim.is_finished
    assert not scheduler.swapped
    assert engine.stats()["kv_host_blocks_used"] == 0
    while not scheduler.swapped:
        assert engine.step() is not None
    # Free device blocks so that a page-in starts, then abort the sequence on its way in.
    for seq in list(scheduler.running):
        engine.abort(seq)
        scheduler.prefetch()
        if scheduler.incoming:
            break
    incoming = scheduler.incoming[0].seq
    engine.abort(incoming)
    assert incoming.is_finished
    for seq in seqs:
        engine.abort(seq)
    while engine.has_work:  # an aborted page-in's blocks go back once its copy is done
        assert engine.step() is None
    stats = engine.stats()
    assert stats["kv_blocks_used"] == 0
    assert stats["kv_host_blocks_used"] == 0
    assert stats["kv_swapped"] == 0
    assert not engine.has_work


def test_aborting_a_sequence_mid_page_in_does_not_wait_for_the_copy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = make_engine(num_blocks=12, host_kv_blocks=32)
    scheduler = tiered(engine)
    tier = scheduler.tier
    gate, copied = threading.Event(), threading.Event()
    real_copy = tier._copy_in

    def held_copy(host_blocks: list[int], device_blocks: list[int]) -> None:
        # Held until the test lets it go; the timeout only ends the wait of an
        # abort that (wrongly) waits for the copy, which the test then fails.
        gate.wait(timeout=20)
        real_copy(host_blocks, device_blocks)
        copied.set()

    monkeypatch.setattr(tier, "_copy_in", held_copy)
    seqs = [
        engine.add(prompt, SamplingParams(max_tokens=n))
        for prompt, n in zip(PROMPTS, (40, 10, 40, 40), strict=True)
    ]
    while not scheduler.incoming:
        assert engine.step() is not None
    assert scheduler.running  # the first page-in starts while others still decode
    record = scheduler.incoming[0]
    held_host = len(record.host_blocks)
    assert record.seq.block_table  # device blocks the copy writes into
    used_before = engine.blocks.stats().num_used
    engine.abort(record.seq)  # issue 32: this waited for the copy on the engine thread
    assert not copied.is_set()
    assert record.seq.is_finished
    # The copy still writes those device blocks and reads those host blocks: kept till it ends.
    assert engine.blocks.stats().num_used == used_before
    assert tier.num_free <= tier.num_blocks - held_host
    step = engine.step()  # the others decode beside the held copy
    assert step is not None
    assert step.seqs
    assert not copied.is_set()
    gate.set()
    engine.run_until_done([seq for seq in seqs if seq is not record.seq])
    while engine.has_work:
        engine.step()
    assert copied.is_set()
    stats = engine.blocks.stats()
    assert stats.num_used == 0
    assert stats.num_free + stats.num_evictable == stats.num_blocks
    assert len(set(tier._free)) == len(tier._free) == tier.num_blocks  # each given back once


@pytest.mark.parametrize("dtype", [torch.float32, torch.int8])
def test_a_page_out_and_in_restores_blocks_bit_for_bit(dtype: torch.dtype) -> None:
    config = ModelConfig(d_model=32, n_heads=2, n_layers=2, d_ff=64)
    cache = KVCache(config, num_blocks=6, block_size=4, device=torch.device("cpu"), dtype=dtype)
    gen = torch.Generator().manual_seed(0)
    slots = torch.arange(24)
    for layer in range(config.n_layers):
        x = torch.randn(24, config.n_heads, config.head_dim, generator=gen)
        cache.write(layer, slots, x, -x)
    before = [view.clone() for view in block_views(cache)]
    tier = HostKVTier(cache, 4)
    host = tier.page_out([1, 4, 2])
    for view in block_views(cache):
        view.zero_()
    handle = tier.page_in(host, [5, 0, 3])
    tier.finish(handle)
    for old, new in zip(before, block_views(cache), strict=True):
        assert torch.equal(new[:, [5, 0, 3]], old[:, [1, 4, 2]])
    assert tier.num_free == 4
    stats = tier.stats()
    assert stats.blocks_out == stats.blocks_in == 3
    assert stats.bytes_out == 3 * cache.bytes_per_block
    with pytest.raises(MemoryError):
        tier.page_out([0, 1, 2, 3, 4])


def test_counters_are_there_and_zero_without_a_tier() -> None:
    stats = make_engine().stats()
    for key in ("kv_swap_outs", "kv_swap_ins", "kv_blocks_out", "kv_blocks_in", "kv_bytes_out"):
        assert stats[key] == 0
    assert stats["kv_stall_ms"] == 0.0
    assert stats["kv_dtype"] == "float32"


def test_reset_counters_zeroes_the_tier() -> None:
    engine = make_engine(num_blocks=12, host_kv_blocks=32)
    engine.generate(PROMPTS, GREEDY)
    assert engine.stats()["kv_swap_outs"] > 0
    engine.reset_counters()
    stats = engine.stats()
    assert stats["kv_swap_outs"] == stats["kv_blocks_out"] == 0
    assert stats["kv_stall_ms"] == stats["kv_page_out_ms"] == 0.0


@pytest.mark.parametrize(
    ("overrides", "message"),
    [({"host_kv_blocks": -1}, "host_kv_blocks"), ({"kv_dtype": "fp8"}, "kv_dtype")],
)
def test_bad_tier_config_is_a_value_error(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EngineConfig(**overrides)
