from __future__ import annotations

import pytest

from yieldgate.harness import block_manager as bm_module
from yieldgate.harness.block_manager import BlockManager
from yieldgate.harness.sequence import SamplingParams, Sequence

PARAMS = SamplingParams(max_tokens=4)


def seq(tokens: list[int], seq_id: int = 0) -> Sequence:
    return Sequence(seq_id, tokens, PARAMS)


def computed(s: Sequence) -> Sequence:
    """Mark every token of ``s`` computed, as a prefill step would."""
    s.num_computed = len(s.tokens)
    return s


def test_allocate_and_free_count_blocks() -> None:
    blocks = BlockManager(num_blocks=8, block_size=4)
    a = seq(list(range(10)))
    blocks.allocate(a)
    assert len(a.block_table) == 3
    assert len(set(a.block_table)) == 3
    assert blocks.num_available == 5
    blocks.free(a)
    assert blocks.num_available == 8
    assert a.block_table == []


def test_a_shared_prefix_is_reused_and_reference_counted() -> None:
    blocks = BlockManager(num_blocks=8, block_size=4)
    a = seq(list(range(12)))
    blocks.allocate(a)
    blocks.commit(computed(a))
    b = seq([*range(8), 99, 98, 97], seq_id=1)
    blocks.allocate(b)
    # Two full blocks (8 tokens) shared; the third differs.
    assert b.num_cached == 8
    assert b.block_table[:2] == a.block_table[:2]
    assert b.block_table[2] != a.block_table[2]
    blocks.free(a)
    # Still referenced by b: not evictable, not free.
    assert blocks.stats().num_used == 3
    blocks.free(b)
    assert blocks.stats().num_used == 0


def test_the_last_token_is_always_computed() -> None:
    blocks = BlockManager(num_blocks=8, block_size=4)
    a = seq(list(range(8)))
    blocks.allocate(a)
    blocks.commit(computed(a))
    blocks.free(a)
    again = seq(list(range(8)), seq_id=1)
    blocks.allocate(again)
    # Both blocks are cached, but the one with the last token is recomputed.
    assert again.num_cached == 4


def test_freed_cached_blocks_are_found_until_evicted_oldest_first() -> None:
    blocks = BlockManager(num_blocks=4, block_size=2)
    a = seq([1, 2, 3, 4, 5])
    blocks.allocate(a)
    blocks.commit(computed(a))
    blocks.free(a)
    assert blocks.stats().num_evictable == 2
    # A hit after free: no block was wiped.
    b = seq([1, 2, 3, 4, 6], seq_id=1)
    blocks.allocate(b)
    assert b.num_cached == 4
    blocks.free(b)
    # Four fresh blocks are needed: the two never-used ones go first, then evictions.
    c = seq([9, 9, 9, 9, 9, 9, 9], seq_id=2)
    blocks.allocate(c)
    assert blocks.evictions == 2
    assert blocks.stats().num_hashed == 0
    blocks.free(c)
    d = seq([1, 2, 3, 4, 5], seq_id=3)
    blocks.allocate(d)
    assert d.num_cached == 0


def test_can_allocate_counts_idle_cached_blocks_as_taken() -> None:
    blocks = BlockManager(num_blocks=3, block_size=2)
    a = seq([1, 2, 3, 4, 5])
    blocks.allocate(a)
    blocks.commit(computed(a))
    blocks.free(a)
    # Reusing the 2 cached blocks takes them out of the pool: 1 left for the tail.
    b = seq([1, 2, 3, 4, 7], seq_id=1)
    assert blocks.can_allocate(b)
    too_long = seq([1, 2, 3, 4, 7, 8, 9], seq_id=2)
    assert not blocks.can_allocate(too_long)
    with pytest.raises(MemoryError):
        blocks.allocate(too_long)
    assert too_long.block_table == []


def test_append_slot_adds_a_block_at_each_boundary() -> None:
    blocks = BlockManager(num_blocks=3, block_size=2)
    a = seq([1, 2])
    blocks.allocate(a)
    assert len(a.block_table) == 1
    a.tokens.append(3)
    assert blocks.can_append(a)
    blocks.append_slot(a)
    assert len(a.block_table) == 2
    a.tokens.append(4)
    blocks.append_slot(a)  # still inside the second block
    assert len(a.block_table) == 2
    a.tokens.extend([5])
    blocks.append_slot(a)
    a.tokens.extend([6, 7])
    assert not blocks.can_append(a)
    with pytest.raises(MemoryError):
        blocks.append_slot(a)


def test_a_hash_collision_is_a_miss_not_a_wrong_hit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bm_module, "chain_hash", lambda prev, tokens: 42)
    blocks = BlockManager(num_blocks=8, block_size=2)
    a = seq([1, 2, 3])
    blocks.allocate(a)
    blocks.commit(computed(a))
    b = seq([7, 8, 9], seq_id=1)
    blocks.allocate(b)
    assert b.num_cached == 0
    assert b.block_table[0] != a.block_table[0]


def test_two_copies_of_one_block_keep_the_first_registered() -> None:
    blocks = BlockManager(num_blocks=8, block_size=2)
    a, b = seq([1, 2, 3]), seq([1, 2, 4], seq_id=1)
    blocks.allocate(a)
    blocks.allocate(b)  # side by side: neither is committed yet
    blocks.commit(computed(a))
    blocks.commit(computed(b))
    blocks.free(b)
    # b's copy was never registered, so it went back to the plain free list.
    assert blocks.stats().num_hashed == 1
    assert blocks.stats().num_evictable == 0
    blocks.free(a)
    assert blocks.stats().num_evictable == 1


def test_bad_sizes() -> None:
    with pytest.raises(ValueError, match="num_blocks"):
        BlockManager(num_blocks=0, block_size=4)
    with pytest.raises(ValueError, match="prompt"):
        Sequence(0, [], PARAMS)
