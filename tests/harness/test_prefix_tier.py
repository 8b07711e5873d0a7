"""The prefix tier: evicted prefix-cache blocks kept in host memory and paged back on a hit."""

from __future__ import annotations

import random
import threading
from typing import Any

import pytest
import torch

from yieldgate.harness.block_manager import BlockManager, chain_hash
from yieldgate.harness.engine import Engine, EngineConfig
from yieldgate.harness.kv_tiers import block_views
from yieldgate.harness.model import KVCache, ModelConfig
from yieldgate.harness.prefix_tier import HostPrefixTier, PrefixPager
from yieldgate.harness.scheduler import SchedulerConfig
from yieldgate.harness.sequence import SamplingParams, Sequence, SequenceStatus

BLOCK = 16
# Six full blocks shared by every "shared" prompt; the questions start a seventh.
SHARED = list((b"You are a careful assistant; answer from the manual. " * 2)[: 6 * BLOCK])
FIRST = [*SHARED, *b"What is a block table?"]
SECOND = [*SHARED, *b"How are blocks evicted, and when?"]
PARAMS = SamplingParams(max_tokens=12)
# Other traffic, one prompt at a time: six full blocks each, none shared with SHARED.
OTHERS = [list(f"{i}: other traffic, not shared. ".encode() * 4)[:100] for i in range(5)]


def make_engine(**overrides: Any) -> Engine:
    return Engine(EngineConfig(**{"device": "cpu", "num_blocks": 24, **overrides}))


def pager(engine: Engine) -> PrefixPager:
    assert engine.prefix_pager is not None
    return engine.prefix_pager


def run_scenario(engine: Engine) -> tuple[list[list[int]], dict[str, Any], dict[str, Any]]:
    """FIRST, the other traffic (which evicts FIRST's blocks from a small pool), then SECOND.

    Returns the outputs, the stats before SECOND and the stats after it.
    """
    outputs = engine.generate([FIRST], PARAMS)
    for prompt in OTHERS:
        engine.generate([prompt], PARAMS)
    before = engine.stats()
    outputs += engine.generate([SECOND], PARAMS)
    return outputs, before, engine.stats()


@pytest.fixture(scope="module")
def large_pool_outputs() -> dict[str, list[list[int]]]:
    """Each dtype's outputs when nothing is ever evicted."""
    out = {}
    for kv_dtype in ("float32", "int8"):
        engine = make_engine(num_blocks=512, kv_dtype=kv_dtype)
        outputs, _, stats = run_scenario(engine)
        assert stats["kv_evictions"] == 0
        assert stats["prefix_hit_tokens"] == len(SHARED)  # SECOND shared FIRST's blocks
        out[kv_dtype] = outputs
    return out


@pytest.mark.parametrize("kv_dtype", ["float32", "int8"])
@pytest.mark.parametrize("host_kv_blocks", [0, 32])
def test_evicted_prefix_blocks_go_to_the_host_and_a_hit_pages_them_back(
    large_pool_outputs: dict[str, list[list[int]]], kv_dtype: str, host_kv_blocks: int
) -> None:
    engine = make_engine(host_prefix_blocks=64, kv_dtype=kv_dtype, host_kv_blocks=host_kv_blocks)
    outputs, before, after = run_scenario(engine)
    # The other traffic evicted FIRST's cached blocks: they went to the host tier.
    assert before["kv_evictions"] > 0
    assert before["kv_prefix_blocks_stored"] == before["kv_evictions"]
    assert before["kv_prefix_host_blocks_used"] == before["kv_prefix_blocks_stored"]
    # SECOND found its six shared blocks there, paged them back and prefilled only the rest.
    assert after["kv_prefix_page_backs"] == 1
    assert after["kv_prefix_blocks_paged_back"] == len(SHARED) // BLOCK
    assert after["prefix_hit_tokens"] == len(SHARED)
    computed = after["prompt_tokens_computed"] - before["prompt_tokens_computed"]
    assert computed == len(SECOND) - len(SHARED)
    # Bytes copied back, not computed: the output is the never-evicted engine's.
    assert outputs == large_pool_outputs[kv_dtype]
    # Everything given back: no pins, no page-back under way, no device block held.
    assert after["kv_prefix_pinned"] == after["kv_prefix_paging_back"] == 0
    assert after["kv_blocks_used"] == 0
    assert not engine.has_work


@pytest.mark.parametrize("kv_dtype", ["float32", "int8"])
def test_without_the_tier_the_evicted_prefix_is_recomputed_to_the_same_output(
    large_pool_outputs: dict[str, list[list[int]]], kv_dtype: str
) -> None:
    engine = make_engine(kv_dtype=kv_dtype)
    outputs, before, after = run_scenario(engine)
    assert outputs == large_pool_outputs[kv_dtype]
    assert after["prefix_hit_tokens"] == 0  # dropped: SECOND computed all of its prompt
    assert after["prompt_tokens_computed"] - before["prompt_tokens_computed"] == len(SECOND)
    assert after["kv_prefix_host_blocks_total"] == after["kv_prefix_blocks_stored"] == 0


def test_a_paged_back_block_is_in_the_device_cache_again_and_not_paged_back_twice() -> None:
    engine = make_engine(host_prefix_blocks=64)
    run_scenario(engine)
    paged_back = engine.stats()["kv_prefix_blocks_paged_back"]
    assert paged_back == len(SHARED) // BLOCK
    third = [*SHARED, *b"And a third question?"]
    engine.generate([third], PARAMS)
    stats = engine.stats()
    assert stats["kv_prefix_blocks_paged_back"] == paged_back  # the device had them
    assert stats["kv_prefix_page_backs"] == 1
    assert stats["prefix_hit_tokens"] == 2 * len(SHARED)


def test_the_plan_prefers_the_device_copy_of_a_block() -> None:
    blocks = BlockManager(num_blocks=4, block_size=4)
    seq = Sequence(0, list(range(13)), PARAMS)  # three full blocks and one token
    blocks.allocate(seq)
    seq.num_computed = 13
    blocks.commit(seq)
    table = list(seq.block_table)
    blocks.free(seq)  # all three cached blocks evictable, the tail first
    evicted: list[int] = []
    blocks.on_evict = lambda block_id, block_hash, tokens: evicted.append(block_id)
    blocks.allocate(Sequence(1, [99, 98], PARAMS))  # one fresh block: the free one
    blocks.allocate(Sequence(2, [97, 96], PARAMS))  # evicts the tail block
    assert evicted == [table[2]]
    plan = blocks.plan_prefix(list(range(13)), lambda block_hash, tokens: True)
    assert [block_id for _, block_id in plan] == [table[0], table[1], -1]
    assert plan[2][0] == chain_hash(plan[1][0], (8, 9, 10, 11))
    # Nothing on the device, nothing in the host: the walk stops at once.
    assert blocks.plan_prefix([5, 6, 7, 8, 9], lambda block_hash, tokens: False) == []


def _cache(kv_dtype: torch.dtype = torch.float32) -> KVCache:
    config = ModelConfig(d_model=32, n_heads=2, n_layers=2, d_ff=64)
    return KVCache(config, num_blocks=8, block_size=4, device=torch.device("cpu"), dtype=kv_dtype)


def _tokens(i: int) -> tuple[int, ...]:
    return (i, i, i, i)


def test_the_host_tier_is_bounded_and_evicts_the_least_recently_used() -> None:
    tier = HostPrefixTier(_cache(), 4)
    for i in range(4):
        tier.store(i, 100 + i, _tokens(i))
    tier.store(0, 100, _tokens(0))  # already held: marked recently used, not copied again
    tier.store(4, 104, _tokens(4))  # full: the least recently used (101) goes
    stats = tier.stats()
    assert len(tier) == stats.host_blocks_used == 4
    assert stats.blocks_stored == 5
    assert stats.blocks_refreshed == 1
    assert stats.host_evictions == 1
    assert not tier.contains(101, _tokens(1))
    assert all(tier.contains(100 + i, _tokens(i)) for i in (0, 2, 3, 4))
    assert not tier.contains(102, _tokens(9))  # a hash collision is a miss
    # A pinned entry (a page-back reads it) is passed over; when all are pinned, nothing is kept.
    tier.pin([102])
    tier.store(5, 105, _tokens(5))
    assert tier.contains(102, _tokens(2))
    assert not tier.contains(103, _tokens(3))
    tier.pin([100, 104, 105])
    tier.store(6, 106, _tokens(6))
    assert not tier.contains(106, _tokens(6))
    assert tier.stats().blocks_dropped == 1
    tier.unpin([100, 102, 104, 105])
    assert tier.stats().pinned == 0
    tier.clear()  # each host block given back once
    pool = tier._pool
    assert len(tier) == tier.stats().host_blocks_used == 0
    assert sorted(pool._free) == list(range(4))


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.int8])
def test_a_stored_block_pages_back_bit_for_bit_scales_included(kv_dtype: torch.dtype) -> None:
    cache = _cache(kv_dtype)
    gen = torch.Generator().manual_seed(0)
    slots = torch.arange(32)
    for layer in range(2):
        x = torch.randn(32, 2, 16, generator=gen) * (layer + 1)
        cache.write(layer, slots, x, -x)
    before = [view.clone() for view in block_views(cache)]
    assert len(before) == (3 if kv_dtype == torch.int8 else 2)  # int8: the scales too
    tier = HostPrefixTier(cache, 4)
    tier.store(1, 11, _tokens(1))
    tier.store(6, 16, _tokens(6))
    for view in block_views(cache):
        view.zero_()
    tier.pin([16, 11])
    handle = tier.page_back([16, 11], [2, 5])
    tier.finish(handle, [16, 11])
    for old, new in zip(before, block_views(cache), strict=True):
        assert torch.equal(new[:, [2, 5]], old[:, [6, 1]])
    # A copy, not a move: the tier still holds both, unpinned.
    assert len(tier) == 2
    assert tier.stats().pinned == 0
    assert tier.stats().blocks_paged_back == 2


def hold_page_backs(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> tuple[threading.Event, threading.Event]:
    """Make the prefix tier's copies wait for the first event; the second is set once one ran."""
    pool = pager(engine).tier._pool
    gate, copied = threading.Event(), threading.Event()
    real_copy = pool._copy_in

    def held_copy(host_blocks: list[int], device_blocks: list[int]) -> None:
        # Held until the test lets it go; the timeout only ends the wait of an
        # engine that (wrongly) waits for the copy, which the test then fails.
        gate.wait(timeout=20)
        real_copy(host_blocks, device_blocks)
        copied.set()

    monkeypatch.setattr(pool, "_copy_in", held_copy)
    return gate, copied


def evict_first(engine: Engine) -> None:
    engine.generate([FIRST], PARAMS)
    for prompt in OTHERS:
        engine.generate([prompt], PARAMS)


def test_a_sequence_paging_back_holds_its_place_in_max_num_seqs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = make_engine(host_prefix_blocks=64, scheduler=SchedulerConfig(max_num_seqs=2))
    evict_first(engine)
    gate, _ = hold_page_backs(engine, monkeypatch)
    seq = engine.add(SECOND, PARAMS)
    fresh = [engine.add(list(f"{i}: fresh, never seen".encode()), PARAMS) for i in range(2)]
    step = engine.step()
    assert step is not None
    assert pager(engine).incoming  # SECOND pages back, one place of two
    assert step.seqs == [fresh[0]]  # the other place; fresh[1] waits
    peak = 0
    gate.set()
    while engine.has_work:
        engine.step()
        busy = len(engine.scheduler.running) + len(pager(engine).incoming)
        peak = max(peak, busy)
    assert peak <= 2
    assert all(s.is_finished for s in (seq, *fresh))
    assert engine.stats()["kv_prefix_blocks_paged_back"] == len(SHARED) // BLOCK


def test_aborting_a_sequence_mid_page_back_frees_its_blocks_and_pins_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = make_engine(host_prefix_blocks=64)
    evict_first(engine)
    tier = pager(engine).tier
    pool = tier._pool
    gate, copied = hold_page_backs(engine, monkeypatch)
    other = engine.add(list(b"fresh traffic, never seen before"), PARAMS)  # beside the copy
    seq = engine.add(SECOND, PARAMS)
    while not pager(engine).incoming:
        assert engine.step() is not None
    assert seq.status is SequenceStatus.SWAPPED
    assert seq.block_table
    stats = engine.stats()
    assert stats["kv_prefix_pinned"] == len(SHARED) // BLOCK
    used = stats["kv_blocks_used"]
    engine.abort(seq)  # does not wait for the held copy
    assert seq.is_finished
    assert not copied.is_set()
    # The copy still writes those device blocks and reads those host blocks: held till it ends.
    stats = engine.stats()
    assert stats["kv_blocks_used"] == used
    assert stats["kv_prefix_pinned"] == len(SHARED) // BLOCK
    assert stats["kv_prefix_paging_back"] == 1
    step = engine.step()
    assert step is not None
    assert other in step.seqs
    gate.set()
    engine.run_until_done([other])
    while engine.has_work:
        engine.step()
    assert copied.is_set()
    stats = engine.stats()
    assert stats["kv_blocks_used"] == 0
    assert stats["kv_prefix_pinned"] == stats["kv_prefix_paging_back"] == 0
    assert stats["kv_prefix_host_blocks_used"] == len(tier)  # the tier's own, still cached
    tier.clear()
    assert sorted(pool._free) == list(range(tier.num_blocks))  # each given back once
    blocks = engine.blocks.stats()
    assert blocks.num_free + blocks.num_evictable == blocks.num_blocks


def test_counters_are_there_and_zero_without_a_tier_and_reset() -> None:
    stats = make_engine().stats()
    assert stats["kv_prefix_blocks_stored"] == stats["kv_prefix_page_backs"] == 0
    engine = make_engine(host_prefix_blocks=64)
    run_scenario(engine)
    engine.reset_counters()
    stats = engine.stats()
    assert stats["kv_prefix_blocks_stored"] == stats["kv_prefix_blocks_paged_back"] == 0
    assert stats["kv_prefix_page_backs"] == 0
    assert stats["kv_prefix_host_blocks_used"] > 0  # the cached blocks stay


@pytest.mark.parametrize("value", [-1, 1.5])
def test_a_bad_host_prefix_blocks_is_a_value_error(value: Any) -> None:
    with pytest.raises(ValueError, match="host_prefix_blocks"):
        EngineConfig(host_prefix_blocks=value)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_traffic_with_aborts_keeps_every_output_and_gives_everything_back(
    monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    # A small pool and tier under prompts from a few shared prefixes, with aborts
    # anywhere (page-backs included): copies "finish" at seeded random steps.
    rng = random.Random(seed)
    engine = make_engine(num_blocks=16, host_prefix_blocks=24)
    tier = pager(engine).tier
    real_is_done = tier.is_done
    monkeypatch.setattr(tier, "is_done", lambda h: real_is_done(h) and rng.random() < 0.5)
    prefixes = [
        list(f"{i}: shared prefix number {i}, two blocks long.".encode())[:32] for i in range(3)
    ]
    live: list[Sequence] = []
    done: list[Sequence] = []
    for _ in range(300):
        op = rng.random()
        if op < 0.25 and len(live) < 6:
            suffix = list(f" q{rng.randrange(1000)}".encode())
            # Most share a prefix; the others are new and evict what is cached.
            fill = list(f"{rng.random()} fills the pool".encode())
            prompt = rng.choice(prefixes) + suffix if rng.random() < 0.6 else fill * 2
            live.append(engine.add(prompt, SamplingParams(max_tokens=rng.randint(1, 6))))
        elif op < 0.35 and live:
            # A sequence paging back first, when there is one.
            paging = [seq for seq in live if seq.status is SequenceStatus.SWAPPED]
            victim = rng.choice(paging or live)
            live.remove(victim)
            engine.abort(victim)
        else:
            engine.step()
        done += [seq for seq in live if seq.is_finished]
        live = [seq for seq in live if not seq.is_finished]
    for _ in range(10_000):
        if not engine.has_work:
            break
        engine.step()
    done += live
    assert not engine.has_work
    stats = engine.stats()
    assert stats["kv_prefix_page_backs"] > 0
    for seq in done:
        assert seq.is_finished
        prompt = seq.tokens[: seq.num_prompt]
        assert seq.output == engine.model.greedy_reference(prompt, seq.params.max_tokens)
    assert stats["kv_blocks_used"] == 0
    assert stats["kv_prefix_pinned"] == stats["kv_prefix_paging_back"] == 0
    pool = tier._pool
    held = [entry.host_block for entry in tier._entries.values()]
    assert len(set(held)) == len(held) == stats["kv_prefix_host_blocks_used"]
    assert sorted(held + pool._free) == list(range(tier.num_blocks))
