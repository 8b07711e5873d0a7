"""The paged KV cache's bookkeeping: blocks, block tables, reference counts, prefix cache.

Blocks hold ``block_size`` tokens each. A sequence owns a block table (block
ids, in order); several sequences may share a block, counted by its
reference count. A block that is full and computed gets a hash chained from
the previous block's hash and its own tokens, so a later prompt that starts
with the same tokens finds it (prefix caching). When its last reader goes,
a hashed block is not wiped: it waits in the evictable pool (least recently
used first) until a block is needed and no never-used block is left.

Hashes are Python's tuple hash (64 bits); a match also compares the tokens,
so a collision costs a cache miss, never a wrong answer.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from yieldgate.harness.sequence import Sequence

__all__ = ["BlockManager", "BlockManagerStats"]

_NO_HASH = -1

# Told of each cached block about to be evicted: its id, hash and tokens (the prefix tier).
EvictListener = Callable[[int, int, tuple[int, ...]], None]
# Whether a block with this hash and these tokens is in a lower tier (the prefix tier).
HostLookup = Callable[[int, tuple[int, ...]], bool]


@dataclass(frozen=True, slots=True)
class BlockManagerStats:
    num_blocks: int
    num_free: int
    num_evictable: int
    num_used: int
    num_hashed: int
    evictions: int


class _Block:
    __slots__ = ("hash", "id", "ref_count", "tokens")

    def __init__(self, block_id: int) -> None:
        self.id = block_id
        self.ref_count = 0
        self.hash = _NO_HASH
        self.tokens: tuple[int, ...] = ()


def chain_hash(prev: int, tokens: tuple[int, ...]) -> int:
    """The hash of a full block whose predecessor's hash is ``prev``."""
    return hash((prev, tokens))


class BlockManager:
    """Allocates KV blocks to sequences, sharing cached prefix blocks."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._blocks = [_Block(i) for i in range(num_blocks)]
        # Never-hashed free blocks first; hashed ones are kept as long as possible.
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self._evictable: OrderedDict[int, None] = OrderedDict()
        self._by_hash: dict[int, int] = {}
        self.evictions = 0
        # Called with a cached block's KV still in place, before the block is reused.
        self.on_evict: EvictListener | None = None

    # -- capacity -------------------------------------------------------------

    @property
    def num_available(self) -> int:
        """Blocks that can be handed out now (free or evictable)."""
        return len(self._free) + len(self._evictable)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def cached_prefix(self, tokens: list[int]) -> int:
        """How many leading tokens of a prompt ``tokens`` the prefix cache would supply."""
        return len(self._match_tokens(tokens)) * self.block_size

    def _match(self, seq: Sequence) -> list[_Block]:
        return self._match_tokens(seq.tokens)

    def _match_tokens(self, all_tokens: list[int]) -> list[_Block]:
        """The cached blocks that start ``all_tokens``, leaving the last token to compute."""
        size = self.block_size
        matched: list[_Block] = []
        prev = _NO_HASH
        # The block holding the last token is never taken from the cache: that
        # token must run through the model to give the next token's logits.
        for start in range(0, len(all_tokens) - 1 - size + 1, size):
            tokens = tuple(all_tokens[start : start + size])
            h = chain_hash(prev, tokens)
            block_id = self._by_hash.get(h)
            if block_id is None or self._blocks[block_id].tokens != tokens:
                break
            matched.append(self._blocks[block_id])
            prev = h
        return matched

    def plan_prefix(self, all_tokens: list[int], in_host: HostLookup) -> list[tuple[int, int]]:
        """The leading full blocks of ``all_tokens`` found on the device or in a lower tier.

        One ``(hash, block id)`` per block, in order, the id ``-1`` for a block
        only ``in_host`` has; the walk stops at the first block neither has. The
        device's copy is preferred, so a block the device holds is never paged
        back. Leaves the last token to compute, as the device cache does.
        """
        size = self.block_size
        plan: list[tuple[int, int]] = []
        prev = _NO_HASH
        for start in range(0, len(all_tokens) - 1 - size + 1, size):
            tokens = tuple(all_tokens[start : start + size])
            h = chain_hash(prev, tokens)
            block_id = self._by_hash.get(h)
            if block_id is not None and self._blocks[block_id].tokens == tokens:
                plan.append((h, block_id))
            elif in_host(h, tokens):
                plan.append((h, -1))
            else:
                break
            prev = h
        return plan

    def allocate_planned(self, seq: Sequence, plan: list[tuple[int, int]]) -> list[int]:
        """Give ``seq`` a block table per ``plan`` (``plan_prefix``): the device's blocks shared,
        fresh blocks for the rest. Returns the fresh blocks the plan's lower-tier blocks go into.

        The counters are left at zero: the KV is not there until the caller has
        copied it in, then sets them and ``commit``s (which registers the copied blocks).
        """
        if seq.block_table:
            raise RuntimeError(f"{seq!r} already holds blocks")
        shared = [self._blocks[block_id] for _, block_id in plan if block_id >= 0]
        if not self._fits(seq, shared):
            raise MemoryError(f"not enough KV blocks for {seq!r}")
        # The shared blocks are claimed first: a fresh block taken for an earlier
        # position must not evict one the plan shares at a later position.
        for block in shared:
            if block.ref_count == 0:
                del self._evictable[block.id]
            block.ref_count += 1
        targets: list[int] = []
        for _, block_id in plan:
            if block_id < 0:
                block_id = self._take().id
                targets.append(block_id)
            seq.block_table.append(block_id)
        for _ in range(self.blocks_for(len(seq.tokens)) - len(plan)):
            seq.block_table.append(self._take().id)
        seq.num_cached = seq.num_computed = seq.num_committed = 0
        seq.last_hash = _NO_HASH
        return targets

    def can_allocate_planned(self, seq: Sequence, plan: list[tuple[int, int]]) -> bool:
        """Whether ``allocate_planned(seq, plan)`` would succeed now."""
        shared = [self._blocks[block_id] for _, block_id in plan if block_id >= 0]
        return self._fits(seq, shared)

    def can_allocate(self, seq: Sequence, *, extra: int = 0) -> bool:
        """Whether ``allocate(seq)`` would succeed now (with ``extra`` more blocks available)."""
        return self._fits(seq, self._match(seq), extra)

    def _fits(self, seq: Sequence, matched: list[_Block], extra: int = 0) -> bool:
        reused_idle = sum(1 for block in matched if block.ref_count == 0)
        fresh = self.blocks_for(len(seq.tokens)) - len(matched)
        return fresh + reused_idle <= self.num_available + extra

    def num_freed_by(self, seqs: list[Sequence]) -> int:
        """Blocks that freeing all of ``seqs`` would make available (shared ones counted once,
        and only when no other sequence holds them)."""
        held: dict[int, int] = {}
        for seq in seqs:
            for block_id in seq.block_table:
                held[block_id] = held.get(block_id, 0) + 1
        return sum(1 for block_id, n in held.items() if self._blocks[block_id].ref_count == n)

    # -- allocation -----------------------------------------------------------

    def allocate(self, seq: Sequence) -> None:
        """Give ``seq`` a block table for all its tokens, reusing cached prefix blocks.

        Sets ``seq.num_cached`` (and ``num_computed``) to the tokens found in
        the cache. Raises ``MemoryError`` when the blocks are not there: call
        ``can_allocate`` first.
        """
        if seq.block_table:
            raise RuntimeError(f"{seq!r} already holds blocks")
        matched = self._match(seq)
        if not self._fits(seq, matched):
            raise MemoryError(f"not enough KV blocks for {seq!r}")
        for block in matched:
            if block.ref_count == 0:
                del self._evictable[block.id]
            block.ref_count += 1
            seq.block_table.append(block.id)
        for _ in range(self.blocks_for(len(seq.tokens)) - len(matched)):
            seq.block_table.append(self._take().id)
        seq.num_cached = seq.num_computed = len(matched) * self.block_size
        seq.num_committed = len(matched)
        seq.last_hash = matched[-1].hash if matched else _NO_HASH

    def allocate_blank(self, seq: Sequence, num_blocks: int) -> None:
        """Give ``seq`` ``num_blocks`` fresh blocks, no prefix matching: for KV copied in
        from elsewhere (the host tier). Its counters are the caller's to set."""
        if seq.block_table:
            raise RuntimeError(f"{seq!r} already holds blocks")
        if num_blocks > self.num_available:
            raise MemoryError(f"not enough KV blocks for {seq!r}")
        seq.block_table.extend(self._take().id for _ in range(num_blocks))

    def can_append(self, seq: Sequence) -> bool:
        """Whether the slot for ``seq``'s last token is there or can be had."""
        return len(seq.block_table) * self.block_size >= len(seq.tokens) or self.num_available > 0

    def append_slot(self, seq: Sequence) -> None:
        """Make sure the last token of ``seq`` has a slot (a new block at a block boundary)."""
        if len(seq.block_table) * self.block_size < len(seq.tokens):
            if self.num_available == 0:
                raise MemoryError(f"no KV block left for {seq!r}")
            seq.block_table.append(self._take().id)

    def free(self, seq: Sequence) -> None:
        """Give back every block of ``seq``; hashed ones stay findable until evicted."""
        # Last block first: when evicted later, the tail of a prefix goes before its head.
        for block_id in reversed(seq.block_table):
            block = self._blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                if block.hash != _NO_HASH:
                    self._evictable[block_id] = None
                else:
                    self._free.append(block_id)
        seq.block_table.clear()
        seq.num_computed = seq.num_cached = seq.num_committed = 0
        seq.last_hash = _NO_HASH

    def commit(self, seq: Sequence) -> None:
        """Register the full, computed blocks of ``seq`` not yet in the prefix cache."""
        size = self.block_size
        full = min(seq.num_computed, len(seq.tokens)) // size
        prev = seq.last_hash
        for index in range(seq.num_committed, full):
            block = self._blocks[seq.block_table[index]]
            if block.hash != _NO_HASH:  # matched from the cache at allocation
                prev = block.hash
                continue
            tokens = tuple(seq.tokens[index * size : (index + 1) * size])
            prev = chain_hash(prev, tokens)
            # Two sequences may have computed the same block side by side: the
            # first one registered stays the cached copy.
            if prev not in self._by_hash:
                block.hash, block.tokens = prev, tokens
                self._by_hash[prev] = block.id
        if full > seq.num_committed:
            seq.num_committed, seq.last_hash = full, prev

    def grow(self, seq: Sequence, num_tokens: int) -> int:
        """Extend ``seq``'s block table towards ``num_tokens`` positions, as far as blocks allow.

        Returns how many positions the table covers now (at most
        ``num_tokens``). Speculative decoding's lookahead: the blocks go back
        with ``shrink`` once the step knows how many tokens it kept.
        """
        while len(seq.block_table) * self.block_size < num_tokens and self.num_available:
            seq.block_table.append(self._take().id)
        return min(num_tokens, len(seq.block_table) * self.block_size)

    def shrink(self, seq: Sequence, num_tokens: int) -> None:
        """Give back the blocks of ``seq`` past the first ``blocks_for(num_tokens)``."""
        keep = self.blocks_for(num_tokens)
        while len(seq.block_table) > keep:
            block = self._blocks[seq.block_table.pop()]
            block.ref_count -= 1
            if block.ref_count == 0:
                if block.hash != _NO_HASH:
                    self._evictable[block.id] = None
                else:
                    self._free.append(block.id)

    def _take(self) -> _Block:
        if self._free:
            block = self._blocks[self._free.pop()]
        else:
            block_id, _ = self._evictable.popitem(last=False)
            block = self._blocks[block_id]
            if self.on_evict is not None:
                self.on_evict(block.id, block.hash, block.tokens)
            del self._by_hash[block.hash]
            block.hash, block.tokens = _NO_HASH, ()
            self.evictions += 1
        block.ref_count = 1
        return block

    def stats(self) -> BlockManagerStats:
        return BlockManagerStats(
            num_blocks=self.num_blocks,
            num_free=len(self._free),
            num_evictable=len(self._evictable),
            num_used=self.num_blocks - self.num_available,
            num_hashed=len(self._by_hash),
            evictions=self.evictions,
        )
