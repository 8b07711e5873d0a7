"""A prefix tier: cached prefix blocks evicted from the device pool kept in host memory.

The block manager's prefix cache keeps a full block's KV after its last
reader goes, until the pool needs the block for something else; then the
KV is dropped and the next prompt that starts the same way computes it
again. With a prefix tier (``EngineConfig.host_prefix_blocks``), an evicted
block's KV is first copied to a pool of host blocks (``HostPrefixTier``),
keyed by the block's prefix hash, least recently used first out when the
pool is full. A new prompt's lookup (``PrefixPager``) walks its blocks from
the start: a block the device still holds is shared as before, one only the
host tier holds is paged back into a fresh device block, and the walk stops
at the first block neither has. The sequence waits for its page-back as a
swapped sequence waits for its page-in (asynchronously, on the host tier's
copy machinery, ``kv_tiers.HostKVTier``), then prefills only the rest.

The ledger. A host block is the tier's from the page-out that filled it to
the LRU eviction that gives it back (once: the entry goes with it). A
page-back pins its entries, so no eviction takes them while the copy reads
them; the pins go when the copy is finished or, for an abort, once the copy
is done (never waited for by the abort), in a ``finally``. The device blocks
a page-back writes are the sequence's, given back by ``BlockManager.free``.
A page-back leaves the host copy in place (a copy, not a move): when the
device evicts the block again, the host tier already has it and only marks
it recently used.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Literal

from yieldgate.harness.block_manager import BlockManager
from yieldgate.harness.kv_tiers import HostKVTier, PageIn
from yieldgate.harness.model import KVCache
from yieldgate.harness.scheduler import Batch, Scheduler
from yieldgate.harness.sequence import Sequence, SequenceStatus

__all__ = ["HostPrefixTier", "PrefixPager", "PrefixTierStats", "prefix_counters"]


@dataclass(frozen=True, slots=True)
class PrefixTierStats:
    """The prefix tier's counters.

    ``blocks_stored``: evicted device blocks copied in; ``blocks_refreshed``:
    evicted blocks the tier already held (no copy); ``blocks_dropped``:
    evicted blocks not kept (every host block pinned); ``host_evictions``:
    entries given up to make room (LRU); ``blocks_paged_back``: blocks
    copied back to the device for a prefix hit.
    """

    host_blocks_total: int
    host_blocks_used: int
    pinned: int
    blocks_stored: int
    blocks_refreshed: int
    blocks_dropped: int
    host_evictions: int
    blocks_paged_back: int
    page_out_ms: float
    stall_ms: float


class _Entry:
    __slots__ = ("host_block", "pins", "tokens")

    def __init__(self, host_block: int, tokens: tuple[int, ...]) -> None:
        self.host_block = host_block
        self.tokens = tokens
        self.pins = 0


class HostPrefixTier:
    """Up to ``num_blocks`` evicted prefix blocks in host memory, by prefix hash, LRU.

    The host pool has the device cache's dtype (int8 blocks keep their scales).
    """

    def __init__(self, cache: KVCache, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError("host_prefix_blocks must be >= 1")
        self.num_blocks = num_blocks
        self._pool = HostKVTier(cache, num_blocks)
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # least recently used first
        self.reset_counters()

    def reset_counters(self) -> None:
        self.blocks_stored = self.blocks_refreshed = self.blocks_dropped = 0
        self.host_evictions = 0
        self._pool.reset_counters()

    def __len__(self) -> int:
        return len(self._entries)

    def contains(self, block_hash: int, tokens: tuple[int, ...]) -> bool:
        """Whether the tier holds this block (its tokens compared: a hash collision misses)."""
        entry = self._entries.get(block_hash)
        return entry is not None and entry.tokens == tokens

    # -- from the device ------------------------------------------------------

    def store(self, block_id: int, block_hash: int, tokens: tuple[int, ...]) -> None:
        """Keep the KV of device block ``block_id``, about to be evicted (``on_evict``)."""
        entry = self._entries.get(block_hash)
        if entry is not None:
            # Already here (paged back earlier, or a collision): no copy.
            if entry.tokens == tokens:
                self._entries.move_to_end(block_hash)
                self.blocks_refreshed += 1
            else:
                self.blocks_dropped += 1
            return
        if not self._pool.num_free and not self._evict_one():
            self.blocks_dropped += 1  # every host block is being paged back
            return
        (host_block,) = self._pool.page_out([block_id])
        self._entries[block_hash] = _Entry(host_block, tokens)
        self.blocks_stored += 1

    def _evict_one(self) -> bool:
        """Give back the least recently used unpinned entry's host block; ``False`` if none."""
        for block_hash, entry in self._entries.items():
            if entry.pins == 0:
                del self._entries[block_hash]
                self._pool.free([entry.host_block])
                self.host_evictions += 1
                return True
        return False

    def clear(self) -> None:
        """Give back every unpinned entry's host block."""
        while self._evict_one():
            pass

    # -- back to the device ---------------------------------------------------

    def pin(self, hashes: list[int]) -> None:
        """Keep these entries (each must be there) until ``unpin``: a page-back reads them."""
        for block_hash in hashes:
            self._entries[block_hash].pins += 1
            self._entries.move_to_end(block_hash)

    def unpin(self, hashes: list[int]) -> None:
        for block_hash in hashes:
            self._entries[block_hash].pins -= 1

    def page_back(self, hashes: list[int], device_blocks: list[int]) -> PageIn:
        """Start copying the pinned entries ``hashes`` into ``device_blocks``."""
        host = [self._entries[block_hash].host_block for block_hash in hashes]
        return self._pool.page_in(host, device_blocks, keep_host=True)

    def is_done(self, handle: PageIn) -> bool:
        return self._pool.is_done(handle)

    def wait(self, handle: PageIn) -> None:
        """Block until ``is_done(handle)`` (not counted as stall)."""
        self._pool.wait(handle)

    def finish(self, handle: PageIn, hashes: list[int]) -> None:
        """Wait for a page-back (stall time) and put it in place; the entries are unpinned."""
        try:
            self._pool.finish(handle)
        finally:
            self.unpin(hashes)

    def discard(self, handle: PageIn, hashes: list[int]) -> None:
        """Unpin the entries of a page-back that ``is_done`` and is not wanted (an abort)."""
        try:
            self._pool.discard(handle)
        finally:
            self.unpin(hashes)

    def stats(self) -> PrefixTierStats:
        pool = self._pool.stats()
        return PrefixTierStats(
            host_blocks_total=self.num_blocks,
            host_blocks_used=pool.host_blocks_used,
            pinned=sum(1 for entry in self._entries.values() if entry.pins),
            blocks_stored=self.blocks_stored,
            blocks_refreshed=self.blocks_refreshed,
            blocks_dropped=self.blocks_dropped,
            host_evictions=self.host_evictions,
            blocks_paged_back=pool.blocks_in,
            page_out_ms=pool.page_out_ms,
            stall_ms=pool.stall_ms,
        )


@dataclass(slots=True)
class _PageBack:
    """A waiting sequence whose prefix blocks are on their way back from the host tier."""

    seq: Sequence
    hashes: list[int]
    handle: PageIn
    num_cached: int


class PrefixPager:
    """Pages host-tier prefix hits back for waiting sequences, around ``scheduler.schedule``.

    The scheduler asks it about each waiting sequence it would admit
    (``on_admit``). One whose prompt has blocks in the host tier (after the
    device's) gets its block table at once, the host blocks are copied into
    its fresh blocks beside the next steps, and when the copy is done it
    joins ``scheduler.ready`` with those tokens counted as cached (status
    ``SWAPPED`` meanwhile). Others are admitted as before.
    """

    def __init__(self, tier: HostPrefixTier, blocks: BlockManager, scheduler: Scheduler) -> None:
        self.tier = tier
        self.blocks = blocks
        self.scheduler = scheduler
        self.incoming: list[_PageBack] = []  # oldest first
        # Aborted while paging back: their device blocks and pins go back once the copy is done.
        self.aborted: list[_PageBack] = []
        blocks.on_evict = tier.store
        scheduler.on_admit = self._on_admit
        scheduler.slot_holders = self._num_paging_back
        self.num_page_backs = 0

    def reset_counters(self) -> None:
        self.num_page_backs = 0
        self.tier.reset_counters()

    @property
    def has_work(self) -> bool:
        return bool(self.incoming or self.aborted)

    def _num_paging_back(self) -> int:
        return len(self.incoming)

    def schedule(self) -> Batch | None:
        """``scheduler.schedule()``, with page-backs started, admitted and reaped around it."""
        self._reap_aborted()
        self._admit(wait_for_one=False)
        batch = self.scheduler.schedule()
        if batch is None and self.incoming:
            # Nothing else can run: wait for the oldest page-back.
            self._admit(wait_for_one=True)
            batch = self.scheduler.schedule()
        elif batch is None and self.aborted:
            # Nothing else can run: the aborted page-back's blocks may let work in.
            self.tier.wait(self.aborted[0].handle)
            self._reap_aborted()
            batch = self.scheduler.schedule()
        return batch

    def _on_admit(self, seq: Sequence, batched: int) -> Literal["admit", "taken", "wait"]:
        """The scheduler's ``on_admit``: start the page-back of a waiting sequence's prefix."""
        scheduler = self.scheduler
        # Sequences paging back hold a place in ``max_num_seqs`` (``slot_holders``):
        # they join the batch soon.
        if scheduler.num_holding_slots + batched >= scheduler.config.max_num_seqs:
            return "wait"
        plan = self.blocks.plan_prefix(seq.tokens, self.tier.contains)
        hashes = [block_hash for block_hash, block_id in plan if block_id < 0]
        if not hashes:
            return "admit"
        if not scheduler._room_for(seq, keep_watermark=bool(scheduler.running)):
            return "wait"
        handle = self._page_back(seq, plan, hashes)
        scheduler.waiting.remove(seq)
        seq.status = SequenceStatus.SWAPPED
        size = self.blocks.block_size
        self.incoming.append(_PageBack(seq, hashes, handle, len(plan) * size))
        self.num_page_backs += 1
        return "taken"

    def allocate_now(self, seq: Sequence) -> bool:
        """Give ``seq`` its blocks, its prefix's host-tier blocks copied back before this returns.

        For a caller that computes the rest at once and has nothing to run
        beside the copy (a prefill worker). Sets ``seq.num_cached`` and
        ``num_computed`` to the tokens found on the device or in the tier, as
        ``BlockManager.allocate`` does for the device alone. ``False`` (nothing
        taken) when the device blocks are not there.
        """
        plan = self.blocks.plan_prefix(seq.tokens, self.tier.contains)
        hashes = [block_hash for block_hash, block_id in plan if block_id < 0]
        if not hashes:
            if not self.blocks.can_allocate(seq):
                return False
            self.blocks.allocate(seq)
            return True
        if not self.blocks.can_allocate_planned(seq, plan):
            return False
        handle = self._page_back(seq, plan, hashes)
        try:
            self.tier.finish(handle, hashes)  # waits; unpins whatever happens
        except BaseException:
            self.blocks.free(seq)
            raise
        seq.num_cached = seq.num_computed = len(plan) * self.blocks.block_size
        self.blocks.commit(seq)  # the paged-back blocks are in the device cache again
        self.num_page_backs += 1
        return True

    def _page_back(self, seq: Sequence, plan: list[tuple[int, int]], hashes: list[int]) -> PageIn:
        """Allocate ``seq``'s blocks by ``plan`` and start copying its tier blocks
        (``hashes``) back into them: the copy's handle. The tier blocks are pinned
        before the allocation, whose evictions make room in the tier; whatever
        fails gives back the pins and the blocks."""
        self.tier.pin(hashes)
        try:
            targets = self.blocks.allocate_planned(seq, plan)
            return self.tier.page_back(hashes, targets)
        except BaseException:
            self.tier.unpin(hashes)
            if seq.block_table:
                self.blocks.free(seq)
            raise

    def _admit(self, *, wait_for_one: bool) -> None:
        arrived = [
            record
            for i, record in enumerate(self.incoming)
            if (wait_for_one and i == 0) or self.tier.is_done(record.handle)
        ]
        for record in arrived:
            self.incoming.remove(record)
            seq = record.seq
            try:
                self.tier.finish(record.handle, record.hashes)
            except BaseException:
                # A failed copy: the sequence is over, its blocks go back.
                self.blocks.free(seq)
                seq.status = SequenceStatus.FINISHED
                raise
            seq.num_cached = seq.num_computed = record.num_cached
            self.blocks.commit(seq)  # the paged-back blocks are in the device cache again
            seq.prefix_hit_tokens += record.num_cached
            seq.status = SequenceStatus.READY
            self.scheduler.ready.append(seq)

    def _reap_aborted(self) -> None:
        """Give back the blocks and pins of aborted page-backs whose copy is done, once each."""
        for record in [r for r in self.aborted if self.tier.is_done(r.handle)]:
            self.aborted.remove(record)
            try:
                self.tier.discard(record.handle, record.hashes)
            finally:
                self.blocks.free(record.seq)

    def abort(self, seq: Sequence) -> bool:
        """Abort ``seq`` if it is paging back (``True``); its blocks go back after the copy."""
        for record in self.incoming:
            if record.seq is seq:
                self.incoming.remove(record)
                self.aborted.append(record)
                seq.status = SequenceStatus.FINISHED
                self._reap_aborted()
                return True
        return False


def prefix_counters(pager: PrefixPager | None) -> dict[str, int | float]:
    """The prefix tier's counters for ``Engine.stats``, zeros without one."""
    stats = pager.tier.stats() if pager else None
    return {
        "kv_prefix_host_blocks_total": stats.host_blocks_total if stats else 0,
        "kv_prefix_host_blocks_used": stats.host_blocks_used if stats else 0,
        "kv_prefix_pinned": stats.pinned if stats else 0,
        "kv_prefix_paging_back": len(pager.incoming) + len(pager.aborted) if pager else 0,
        "kv_prefix_page_backs": pager.num_page_backs if pager else 0,
        "kv_prefix_blocks_stored": stats.blocks_stored if stats else 0,
        "kv_prefix_blocks_refreshed": stats.blocks_refreshed if stats else 0,
        "kv_prefix_blocks_dropped": stats.blocks_dropped if stats else 0,
        "kv_prefix_host_evictions": stats.host_evictions if stats else 0,
        "kv_prefix_blocks_paged_back": stats.blocks_paged_back if stats else 0,
        "kv_prefix_page_out_ms": stats.page_out_ms if stats else 0.0,
        "kv_prefix_stall_ms": stats.stall_ms if stats else 0.0,
    }
