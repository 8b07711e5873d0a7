"""A KV memory hierarchy: running sequences' KV paged out to host memory instead of recomputed.

When a decode step needs a KV block and the device pool has none, the
plain scheduler preempts the newest running sequence and later prefills it
again over its prompt and output (recompute). With a host tier, that
sequence's blocks are copied to a second pool in host memory instead
(page-out), the device blocks go back to the pool at once, and the
sequence waits in ``swapped`` with its counters kept. When the device pool
has room again it gets fresh device blocks, its KV is copied back (page-in)
and it rejoins the decode batch where it left off: no token is computed twice.

What is cold. Decode attention reads every block of every running sequence
at every step, so paging single blocks of a sequence that keeps running
would page them back in at the very next step. The unit is therefore the
whole sequence, and the cold one is the one the scheduler would preempt:
the newest running sequence (the least progress, the last in first-come
order; with priority on, of the lowest priority). Sequences come back oldest
first (highest priority first, then oldest, with priority on), and no new
prompt is admitted while any sequence is swapped out (but a high one passes
those that are not high: ``Scheduler.may_pass``), as recompute would too.

Prefetch. Page-ins are issued as soon as blocks free up, at the end of a
step (``finish_step``), and run beside the next step: on CUDA on a side
stream into pinned host memory (``non_blocking`` copies, ordered against
the compute stream by events), on CPU on a copy thread (torch releases the
GIL in its copy kernels, and the two pools are plain tensors). A sequence
joins a step only once its page-in has finished; the engine waits for one
(``stall_ms``) only when nothing else could run. An abort never waits for a
page-in: the aborted sequence's device and host blocks are given back by the
first step that finds its copy done (``aborted``).

Page-outs are synchronous on CPU: the blocks they free are needed by the
step that asked. On CUDA the blocks are gathered on the compute stream
(so later kernels may overwrite them) and copied to the host on the side stream.
"""

from __future__ import annotations

import bisect
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch
from torch import Tensor

from yieldgate.harness._sync import to_device
from yieldgate.harness.block_manager import BlockManager
from yieldgate.harness.model import KVCache
from yieldgate.harness.scheduler import Batch, Scheduler, SchedulerConfig
from yieldgate.harness.sequence import Sequence, SequenceStatus

__all__ = ["HostKVTier", "KVTierStats", "PageIn", "TieredScheduler", "block_views", "tier_counters"]


@dataclass(frozen=True, slots=True)
class KVTierStats:
    """The host tier's counters: blocks and bytes each way, and the time spent on them.

    ``stall_ms`` is the time steps waited for page-ins to finish;
    ``page_out_ms`` the time page-outs took on the engine's thread.
    """

    host_blocks_total: int
    host_blocks_used: int
    blocks_out: int
    blocks_in: int
    bytes_out: int
    bytes_in: int
    page_out_ms: float
    stall_ms: float


def block_views(cache: KVCache) -> list[Tensor]:
    """Views of the cache's tensors with the block index as dimension 1 (int8 scales included)."""
    return [*cache.blocked, cache.kv_scale] if cache.quantized else list(cache.blocked)


class PageIn:
    """A page-in under way: host blocks being copied into a sequence's device blocks."""

    __slots__ = (
        "_event",
        "_future",
        "_index",
        "_staged",
        "device_blocks",
        "host_blocks",
        "keep_host",
    )

    def __init__(
        self, host_blocks: list[int], device_blocks: list[int], *, keep_host: bool = False
    ) -> None:
        self.host_blocks = host_blocks
        self.device_blocks = device_blocks
        # The host blocks stay their owner's once copied (the prefix tier keeps them).
        self.keep_host = keep_host
        self._future: Future[None] | None = None
        self._event: torch.cuda.Event | None = None
        self._staged: list[Tensor] = []
        self._index: Tensor | None = None


class HostKVTier:
    """A pool of ``num_blocks`` KV blocks in host memory, and the copies to and from the cache.

    The host pool is block-major (one contiguous region per block), so that
    on CUDA each block moves in one ``non_blocking`` copy from or to pinned memory.
    """

    def __init__(self, cache: KVCache, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError("num_blocks must be >= 1")
        self.num_blocks = num_blocks
        self.bytes_per_block = cache.bytes_per_block
        self.device = cache.k.device
        self._cuda = self.device.type == "cuda"
        self._views = block_views(cache)
        self._cache = cache  # its resident rows built from a block paged into go
        self._host = [
            torch.zeros(
                (num_blocks, view.shape[0], *view.shape[2:]),
                dtype=view.dtype,
                pin_memory=self._cuda,
            )
            for view in self._views
        ]
        self._free = list(range(num_blocks - 1, -1, -1))
        self._stream = torch.cuda.Stream(self.device) if self._cuda else None  # type: ignore[no-untyped-call]
        self._copier: ThreadPoolExecutor | None = None
        self.reset_counters()

    def reset_counters(self) -> None:
        self.blocks_out = self.blocks_in = 0
        self.page_out_ms = self.stall_ms = 0.0

    @property
    def num_free(self) -> int:
        return len(self._free)

    # -- page-out -------------------------------------------------------------

    def page_out(self, device_blocks: list[int]) -> list[int]:
        """Copy ``device_blocks`` to free host blocks and return those, in the same order.

        The device blocks may be handed to another sequence as soon as this returns.
        """
        if len(device_blocks) > len(self._free):
            raise MemoryError("not enough host KV blocks")
        started = time.perf_counter()
        host = [self._free.pop() for _ in device_blocks]
        # Queued, not waited for, on CUDA (pinned): a page-out happens mid-step.
        (index,) = to_device([device_blocks], self.device)
        if self._stream is not None:
            compute = torch.cuda.current_stream(self.device)
            # The gather runs on the compute stream, so later kernels that
            # overwrite these blocks are ordered after it.
            staged = [
                view.index_select(1, index).transpose(0, 1).contiguous() for view in self._views
            ]
            self._stream.wait_stream(compute)
            with torch.cuda.stream(self._stream):
                for part, pool in zip(staged, self._host, strict=True):
                    for row, block in enumerate(host):
                        pool[block].copy_(part[row], non_blocking=True)
                    part.record_stream(self._stream)
        else:
            host_index = torch.tensor(host)
            for view, pool in zip(self._views, self._host, strict=True):
                pool.index_copy_(0, host_index, view.index_select(1, index).transpose(0, 1))
        self.blocks_out += len(host)
        self.page_out_ms += (time.perf_counter() - started) * 1000.0
        return host

    def free(self, host_blocks: list[int]) -> None:
        """Give back host blocks whose KV is no longer wanted (an aborted sequence)."""
        self._free.extend(host_blocks)

    # -- page-in --------------------------------------------------------------

    def page_in(
        self, host_blocks: list[int], device_blocks: list[int], *, keep_host: bool = False
    ) -> PageIn:
        """Start copying ``host_blocks`` into ``device_blocks``; ``finish`` before reading them.

        ``keep_host``: ``finish`` and ``discard`` leave the host blocks taken (a
        copy, not a move: the prefix tier keeps them), to be given back with ``free``.
        """
        if len(host_blocks) != len(device_blocks):
            raise ValueError("page_in needs one device block per host block")
        handle = PageIn(list(host_blocks), list(device_blocks), keep_host=keep_host)
        if self._cache.resident is not None:
            self._cache.resident.drop_blocks(set(device_blocks))
        if self._stream is not None:
            # The index is made on the compute stream, the only one that reads it.
            (handle._index,) = to_device([device_blocks], self.device)
            with torch.cuda.stream(self._stream):
                for pool in self._host:
                    staged = torch.empty(
                        (len(host_blocks), *pool.shape[1:]), dtype=pool.dtype, device=self.device
                    )
                    for row, block in enumerate(host_blocks):
                        staged[row].copy_(pool[block], non_blocking=True)
                    handle._staged.append(staged)
                event = torch.cuda.Event()  # type: ignore[no-untyped-call]
                event.record(self._stream)
            handle._event = event
        else:
            if self._copier is None:
                self._copier = ThreadPoolExecutor(1, thread_name_prefix="yieldgate-kv-page-in")
            handle._future = self._copier.submit(self._copy_in, host_blocks, device_blocks)
        return handle

    def _copy_in(self, host_blocks: list[int], device_blocks: list[int]) -> None:
        # On the copy thread (CPU): only the sequence's own blocks are written.
        index = torch.tensor(device_blocks)
        host_index = torch.tensor(host_blocks)
        for view, pool in zip(self._views, self._host, strict=True):
            view.index_copy_(1, index, pool.index_select(0, host_index).transpose(0, 1))

    def is_done(self, handle: PageIn) -> bool:
        """Whether ``finish(handle)`` would return without waiting."""
        if handle._event is not None:
            return bool(handle._event.query())  # type: ignore[no-untyped-call]
        return handle._future is None or handle._future.done()

    def finish(self, handle: PageIn) -> None:
        """Wait for the page-in (stall time), put it in place and free its host blocks."""
        if not self.is_done(handle):
            started = time.perf_counter()
            self._wait(handle)
            self.stall_ms += (time.perf_counter() - started) * 1000.0
        if handle._event is not None:
            compute = torch.cuda.current_stream(self.device)
            compute.wait_event(handle._event)
            assert handle._index is not None
            for view, staged in zip(self._views, handle._staged, strict=True):
                view.index_copy_(1, handle._index, staged.transpose(0, 1))
                staged.record_stream(compute)
            handle._staged = []
        elif handle._future is not None:
            handle._future.result()  # re-raises a failed copy
        self.blocks_in += len(handle.host_blocks)
        if not handle.keep_host:
            self._free.extend(handle.host_blocks)

    def discard(self, handle: PageIn) -> None:
        """Free the host blocks of a page-in that ``is_done`` whose KV is not wanted (an abort).

        Nothing is put in place and a failed copy is not raised: the blocks'
        contents no longer matter, only that the copy no longer touches them.
        """
        if not self.is_done(handle):
            raise RuntimeError("discard of a page-in still under way")
        handle._staged = []
        if not handle.keep_host:
            self._free.extend(handle.host_blocks)

    def wait(self, handle: PageIn) -> None:
        """Block until ``is_done(handle)`` (time not counted as stall: no step needed it)."""
        self._wait(handle)

    def _wait(self, handle: PageIn) -> None:
        if handle._event is not None:
            handle._event.synchronize()
        elif handle._future is not None:
            handle._future.exception()

    def stats(self) -> KVTierStats:
        return KVTierStats(
            host_blocks_total=self.num_blocks,
            host_blocks_used=self.num_blocks - len(self._free),
            blocks_out=self.blocks_out,
            blocks_in=self.blocks_in,
            bytes_out=self.blocks_out * self.bytes_per_block,
            bytes_in=self.blocks_in * self.bytes_per_block,
            page_out_ms=self.page_out_ms,
            stall_ms=self.stall_ms,
        )


@dataclass(slots=True)
class _Swapped:
    """A sequence whose KV is in the host tier, with the counters its blocks' KV stands for."""

    seq: Sequence
    host_blocks: list[int]
    num_computed: int
    num_cached: int
    num_committed: int
    last_hash: int
    page_in: PageIn | None = None


class TieredScheduler(Scheduler):
    """The scheduler with a host tier: preemption pages out instead of recomputing.

    A sequence whose blocks do not fit the host tier's free blocks is
    preempted by recompute as before (counted in ``num_preemptions``).
    """

    def __init__(self, config: SchedulerConfig, blocks: BlockManager, tier: HostKVTier) -> None:
        super().__init__(config, blocks)
        self.tier = tier
        self.swapped: list[_Swapped] = []  # the next to come back first (``_return_key``)
        self.incoming: list[_Swapped] = []  # page-in under way
        # Aborted while paging in: their device and host blocks go back once
        # the copy is done (``_reap_aborted``), never waited for by the abort.
        self.aborted: list[_Swapped] = []
        self.num_swap_outs = 0
        self.num_swap_ins = 0

    def reset_counters(self) -> None:
        self.num_swap_outs = self.num_swap_ins = 0
        self.tier.reset_counters()

    @property
    def has_work(self) -> bool:
        return super().has_work or bool(self.swapped or self.incoming or self.aborted)

    @property
    def num_swapped(self) -> int:
        """Sequences whose KV is in the host tier or on its way back."""
        return len(self.swapped) + len(self.incoming)

    def decode_steps_to_admit(self) -> int:
        """Decode steps before a new prompt can be admitted: the swapped sequences come back first.

        The running sequences finish in the order of the tokens they have left
        (one a step) and free their blocks; the swapped ones are back once the free blocks
        hold all of them (each with one block for its next token, and the
        watermark). A lower bound: the running sequences' growth meanwhile,
        and blocks that stay shared in the prefix cache, are not counted.
        """
        if not self.swapped:
            return 1 if self.incoming else 0
        free = self.blocks.num_available
        need = self._watermark_blocks + sum(len(r.host_blocks) + 1 for r in self.swapped)
        steps = 1
        for seq in sorted(self.running, key=_tokens_left):
            if need <= free:
                break
            free += len(seq.block_table)
            steps = max(steps, _tokens_left(seq))
        return steps

    def _held_back(self, seq: Sequence) -> bool:
        # Swapped-out sequences come back before anything new is admitted (``may_pass``).
        pending = [record.seq for record in (*self.swapped, *self.incoming)]
        return bool(pending) and not self.may_pass(seq, pending)

    def _num_joining(self) -> int:
        return len(self.incoming)

    def _preempt(self, seq: Sequence) -> None:
        count = len(seq.block_table)
        if count == 0 or count > self.tier.num_free:
            super()._preempt(seq)
            return
        host = self.tier.page_out(seq.block_table)
        record = _Swapped(
            seq, host, seq.num_computed, seq.num_cached, seq.num_committed, seq.last_hash
        )
        self.running.remove(seq)
        self.blocks.free(seq)
        seq.status = SequenceStatus.SWAPPED
        self.num_swap_outs += 1
        bisect.insort(self.swapped, record, key=self._return_key)

    def _return_key(self, record: _Swapped) -> tuple[int, int]:
        """Swapped sequences come back oldest first, of the highest priority first when on."""
        seq = record.seq
        return (seq.rank if self.config.priority else 0, seq.id)

    def _next_back(self) -> _Swapped:
        """The next to come back: by ``_return_key``, one past the age bound as high."""
        if not self.config.priority:
            return self.swapped[0]
        return min(self.swapped, key=lambda r: (self.effective_rank(r.seq), r.seq.id))

    def schedule(self) -> Batch | None:
        self._reap_aborted()
        self.prefetch()
        self._admit_paged_in(wait_for_one=False)
        batch = super().schedule()
        if batch is None and self.incoming:
            # Nothing else can run: wait for the oldest page-in.
            self._admit_paged_in(wait_for_one=True)
            batch = super().schedule()
        elif batch is None and self.aborted:
            # Nothing else can run: wait for an aborted page-in, whose blocks may let work in.
            oldest = self.aborted[0].page_in
            assert oldest is not None
            self.tier.wait(oldest)
            self._reap_aborted()
            self.prefetch()
            batch = super().schedule()
        return batch

    def _reap_aborted(self) -> None:
        """Give back the blocks of aborted page-ins whose copy is done, each exactly once."""
        for record in [r for r in self.aborted if _is_done(self.tier, r)]:
            self.aborted.remove(record)
            assert record.page_in is not None
            self.tier.discard(record.page_in)
            self.blocks.free(record.seq)

    def finish_step(self, batch: Batch, tokens: list[int]) -> list[Sequence]:
        done = super().finish_step(batch, tokens)
        self.prefetch()  # blocks just freed: start page-ins to run beside the next step
        return done

    def prefetch(self) -> None:
        """Start page-ins, in ``swapped`` order, while the device pool has room.

        A sequence comes back when its blocks, one more for its next token and
        the watermark fit (only its blocks when nothing else holds a slot), and
        a slot in ``max_num_seqs`` is free (``num_holding_slots``). One not served
        as high waits while a waiting one is: it would be preempted again at once.
        """
        while self.swapped:
            record = self._next_back()
            busy = self.num_holding_slots
            need = len(record.host_blocks) + (1 + self._watermark_blocks if busy else 0)
            if need > self.blocks.num_available or busy >= self.config.max_num_seqs:
                return
            if self.effective_rank(record.seq) != 0 and self.high_waiting():
                return
            self.swapped.remove(record)
            self.blocks.allocate_blank(record.seq, len(record.host_blocks))
            record.page_in = self.tier.page_in(record.host_blocks, record.seq.block_table)
            self.incoming.append(record)

    def _admit_paged_in(self, *, wait_for_one: bool) -> None:
        arrived = [
            record
            for i, record in enumerate(self.incoming)
            if (wait_for_one and i == 0) or _is_done(self.tier, record)
        ]
        for record in arrived:
            self.incoming.remove(record)
            assert record.page_in is not None
            self.tier.finish(record.page_in)
            seq = record.seq
            seq.num_computed, seq.num_cached = record.num_computed, record.num_cached
            seq.num_committed, seq.last_hash = record.num_committed, record.last_hash
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            self.num_swap_ins += 1

    def abort(self, seq: Sequence) -> None:
        if seq.status is not SequenceStatus.SWAPPED:
            super().abort(seq)
            return
        for record in self.swapped:
            if record.seq is seq:
                self.swapped.remove(record)
                self.tier.free(record.host_blocks)
                break
        for record in self.incoming:
            if record.seq is seq:
                self.incoming.remove(record)
                # The copy may still be writing its device blocks and reading its
                # host blocks: both go back once it is done, not waited for here.
                self.aborted.append(record)
                self._reap_aborted()
                break
        seq.status = SequenceStatus.FINISHED


def tier_counters(scheduler: Scheduler) -> dict[str, int | float]:
    """The host tier's counters for ``Engine.stats``, zeros for a scheduler without one."""
    tiered = scheduler if isinstance(scheduler, TieredScheduler) else None
    stats = tiered.tier.stats() if tiered else None
    return {
        "kv_host_blocks_total": stats.host_blocks_total if stats else 0,
        "kv_host_blocks_used": stats.host_blocks_used if stats else 0,
        "kv_swapped": tiered.num_swapped if tiered else 0,
        "kv_swap_outs": tiered.num_swap_outs if tiered else 0,
        "kv_swap_ins": tiered.num_swap_ins if tiered else 0,
        "kv_blocks_out": stats.blocks_out if stats else 0,
        "kv_blocks_in": stats.blocks_in if stats else 0,
        "kv_bytes_out": stats.bytes_out if stats else 0,
        "kv_bytes_in": stats.bytes_in if stats else 0,
        "kv_page_out_ms": stats.page_out_ms if stats else 0.0,
        "kv_stall_ms": stats.stall_ms if stats else 0.0,
    }


def _tokens_left(seq: Sequence) -> int:
    return seq.params.max_tokens - seq.num_output


def _is_done(tier: HostKVTier, record: _Swapped) -> bool:
    return record.page_in is not None and tier.is_done(record.page_in)
