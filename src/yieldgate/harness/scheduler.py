"""Continuous batching: which sequences run in the next step.

Every step is either a prefill (new sequences' prompts, as many as fit in
``max_num_seqs``, ``max_num_batched_tokens`` and the free KV blocks) or a
decode (one token for every running sequence). Prefill goes first, so a
request that arrives while others decode starts at the next step boundary
instead of waiting for them to finish; a finished sequence leaves at once.

When a decode step needs a new KV block and none is left, the newest running
sequence is preempted: its blocks are freed and it goes back to the head of
the waiting queue, to be prefilled again over its prompt and its output so
far (recompute). Its full blocks usually survive in the prefix cache, so the
recompute is often cheap.

Priority (``SchedulerConfig.priority``, on by default). The waiting queue is
served high before normal before low, in arrival order within a priority; a
sequence that arrived ``priority_age_bound`` steps ago or more is served as if
it were high (in arrival order among the high ones), so a steady stream of
high requests delays a low one by at most that many steps before it is at
the front. A sequence preempted by recompute keeps its arrival, so an old one
goes back near the front, where first-come-first-served puts it too. The
front of the queue still blocks the rest when it does not fit, as in
first-come-first-served: nothing smaller slips past it. Preemption takes the
lowest priority first, the newest within a priority. The ``ready`` sequences
(their KV already in their blocks) are prefilled before the waiting ones, in the
same order and with the same age bound. Off, every priority is served alike:
first come, first served.

Preemption for a waiting high one (``SchedulerConfig.preempt_for_high``). When
the front of the waiting queue is served as high (its priority, or its age)
and does not fit (no slot in ``max_num_seqs``, or not enough KV blocks), the
least protected running sequences that are neither high nor past the age
bound are preempted for it (paged out to the host tier if there is one, else
recomputed later), the fewest that make room, and none when even all of them
would not. A preempted sequence keeps its arrival, so it ages like any other:
once past the bound it is served as high and is never preempted for a waiting
one again, which bounds how often it can be pushed back.

Chunked prefill (``SchedulerConfig.prefill_chunk``). A prompt is computed at
most that many tokens a step; a sequence whose piece falls short of its prompt
gets no token, keeps its blocks and goes to the ``ready`` queue for its next
piece, and while sequences decode, a decode step runs between two pieces. A
long prompt then holds up the decoding sequences, and a high one whose KV has
just arrived, for one piece at a time instead of its whole prefill.

Slots. Everything that holds or is about to take a place in the decode batch
counts against ``max_num_seqs`` (``num_holding_slots``): the running sequences,
the ``ready`` ones, and those the tiers are paging in (``slot_holders``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from yieldgate.harness.block_manager import BlockManager
from yieldgate.harness.sequence import Sequence, SequenceStatus

__all__ = ["AdmitHook", "Batch", "Scheduler", "SchedulerConfig", "SlotHolders"]

# Asked about the head of the waiting queue before it is given blocks, with the
# sequences this step has taken so far: "admit" it as usual, it was "taken" off
# the queue (the prefix tier pages its blocks back first), or it must "wait".
AdmitHook = Callable[[Sequence, int], Literal["admit", "taken", "wait"]]
# Sequences outside the scheduler's queues that will join the batch (the prefix
# tier's page-backs): each holds a place in ``max_num_seqs``.
SlotHolders = Callable[[], int]


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerConfig:
    """Limits of one step.

    ``max_num_batched_tokens`` bounds the prompt tokens computed in one
    prefill step (a prompt longer than that is refused up front; a sequence
    being recomputed after a preemption may exceed it when it runs alone).
    ``watermark`` is the share of KV blocks a prefill leaves free for the
    running sequences to grow into, so that admitting work does not at once
    force preemptions.
    """

    max_num_seqs: int = 16
    max_num_batched_tokens: int = 2048
    watermark: float = 0.01
    # Serve and preempt by the sequences' priority (off: first come, first served).
    priority: bool = True
    # Steps a waiting sequence waits before it is served as if it were high priority.
    priority_age_bound: int = 1000
    # With priority on: preempt running sequences for a waiting high one that does not fit.
    preempt_for_high: bool = True
    # Compute a prompt in pieces of at most this many tokens, a decode step between
    # two pieces while sequences decode (0: each prompt in one step).
    prefill_chunk: int = 0

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        if self.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be >= 1")
        if type(self.prefill_chunk) is not int or self.prefill_chunk < 0:
            raise ValueError(
                f"prefill_chunk must be an integer >= 0 (0: no chunks), got {self.prefill_chunk!r}"
            )
        if not 0.0 <= self.watermark < 1.0:
            raise ValueError("watermark must be in [0, 1)")
        if type(self.priority_age_bound) is not int or self.priority_age_bound < 1:
            raise ValueError(
                f"priority_age_bound must be an integer >= 1, got {self.priority_age_bound!r}"
            )


@dataclass(frozen=True, slots=True)
class Batch:
    """One step's work: ``seqs`` to prefill (``is_prefill``) or to decode by one token.

    ``ends`` is where each sequence's prefill stops (its KV computed up to there),
    empty when each is computed to its last token. A sequence stopped short (a
    piece of a chunked prefill) gets no token from the step.
    """

    is_prefill: bool
    seqs: list[Sequence]
    ends: tuple[int, ...] = ()

    def prefill_ends(self) -> list[int]:
        """Where each sequence's prefill stops."""
        return list(self.ends) if self.ends else [len(seq.tokens) for seq in self.seqs]

    @property
    def sampled(self) -> list[Sequence]:
        """The sequences that get a token from this step, in ``seqs``'s order."""
        if not self.ends:
            return self.seqs
        pairs = zip(self.seqs, self.ends, strict=True)
        return [seq for seq, end in pairs if end == len(seq.tokens)]

    @property
    def num_new_tokens(self) -> int:
        if not self.is_prefill:
            return len(self.seqs)
        ends = self.prefill_ends()
        return sum(end - seq.num_computed for seq, end in zip(self.seqs, ends, strict=True))


class Scheduler:
    """Waiting and running sequences over one ``BlockManager``."""

    def __init__(self, config: SchedulerConfig, blocks: BlockManager) -> None:
        self.config = config
        self.blocks = blocks
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        # Disaggregated prefill: sequences whose KV a prefill worker computes
        # into blocks reserved here, and those whose KV has arrived.
        self.remote: dict[int, Sequence] = {}
        self.ready: deque[Sequence] = deque()
        self.num_preemptions = 0
        # Steps scheduled so far: the clock that waiting sequences age by.
        self.clock = 0
        # Preemptions made for a waiting high-priority sequence (in ``num_preemptions`` too).
        self.num_priority_preemptions = 0
        self._watermark_blocks = int(config.watermark * blocks.num_blocks)
        self.on_admit: AdmitHook | None = None
        self.slot_holders: SlotHolders | None = None
        # A piece of a chunked prefill ran last: the next step decodes, if anything does.
        self._decode_due = False

    @property
    def num_holding_slots(self) -> int:
        """Sequences that hold a place in ``max_num_seqs``: running, ready, or joining soon."""
        held = len(self.running) + len(self.ready) + self._num_joining()
        return held + (self.slot_holders() if self.slot_holders is not None else 0)

    def _num_joining(self) -> int:
        """Sequences this scheduler is bringing back into the batch (a host tier's page-ins)."""
        return 0

    @property
    def has_work(self) -> bool:
        """Whether a step could run now (sequences at a prefill worker do not count)."""
        return bool(self.waiting or self.running or self.ready)

    @property
    def num_swapped(self) -> int:
        """Sequences swapped out to a host KV tier: none here (``TieredScheduler`` has one)."""
        return 0

    @property
    def num_decoding(self) -> int:
        """Sequences in decode: those running and those swapped out.

        The decode load the router weighs: a swapped-out sequence decodes
        again once it is paged back in.
        """
        return len(self.running) + self.num_swapped

    def decode_steps_to_admit(self) -> int:
        """Decode steps that must run before a new prompt can be admitted at all.

        0 here: a sequence preempted by recompute waits in ``waiting``, whose
        prompt tokens the caller counts already. The host tier's scheduler
        holds new prompts back while sequences are swapped out.
        """
        return 0

    def reserve_remote(self, seq: Sequence) -> bool:
        """Give ``seq`` its KV blocks now, for a prefill worker to fill; ``False`` if none.

        Allocating before the transfer is the backpressure of disaggregation:
        a prefill worker only ever computes KV that has somewhere to go.
        """
        if not self._room_for(seq, keep_watermark=True):
            return False
        self.blocks.allocate(seq)
        seq.arrival_step = self.clock
        seq.status = SequenceStatus.REMOTE
        seq.prefix_hit_tokens += seq.num_cached
        self.remote[seq.id] = seq
        return True

    def _room_for(self, seq: Sequence, *, keep_watermark: bool, freed: int = 0) -> bool:
        """Whether ``seq`` can have its blocks now, leaving the watermark free if asked.

        ``freed``: as if that many more blocks were available (preemption's what-if).
        """
        if self._held_back(seq) or not self.blocks.can_allocate(seq, extra=freed):
            return False
        need = self.blocks.blocks_for(len(seq.tokens))
        available = self.blocks.num_available + freed
        return not keep_watermark or available - need >= self._watermark_blocks

    def _held_back(self, seq: Sequence) -> bool:
        """Whether ``seq`` may not be given blocks yet whatever is free (the host tier's rule)."""
        return False

    def effective_rank(self, seq: Sequence) -> int:
        """``seq.rank``, or 0 (high) once it arrived ``priority_age_bound`` steps ago."""
        if seq.arrival_step <= self.clock - self.config.priority_age_bound:
            return 0
        return seq.rank

    def may_pass(self, seq: Sequence, others: list[Sequence]) -> bool:
        """Whether ``seq`` may be admitted before ``others`` (swapped out) come back: when it
        is served as high and none of them is (``preempt_for_high``)."""
        cfg = self.config
        if not (cfg.priority and cfg.preempt_for_high) or self.effective_rank(seq) != 0:
            return False
        return all(self.effective_rank(other) != 0 for other in others)

    def high_waiting(self) -> bool:
        """Whether a waiting sequence may preempt running ones (``preempt_for_high``)."""
        cfg = self.config
        if not (cfg.priority and cfg.preempt_for_high):
            return False
        return any(self.effective_rank(seq) == 0 for seq in self.waiting)

    def kv_arrived(self, seq: Sequence, num_computed: int) -> None:
        """The KV of ``seq``'s first ``num_computed`` tokens is in its blocks now."""
        del self.remote[seq.id]
        seq.num_computed = num_computed
        seq.status = SequenceStatus.READY
        self.ready.append(seq)

    def remote_failed(self, seq: Sequence) -> None:
        """The prefill worker gave up on ``seq``: prefill it here, in the blocks it holds."""
        del self.remote[seq.id]
        seq.num_computed = seq.num_cached
        seq.status = SequenceStatus.READY
        self.ready.append(seq)

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        seq.arrival_step = self.clock
        self.waiting.append(seq)

    def waiting_order(self) -> list[Sequence]:
        """The waiting sequences in the order they are served (see the module docstring)."""
        return self._serving_order(self.waiting)

    def ready_order(self) -> list[Sequence]:
        """The ``ready`` sequences in the order they are prefilled: as ``waiting_order``."""
        return self._serving_order(self.ready)

    def _serving_order(self, queue: deque[Sequence]) -> list[Sequence]:
        """``queue`` by priority, an aged sequence as high, then by id; as it is when off."""
        if not self.config.priority:
            return list(queue)
        horizon = self.clock - self.config.priority_age_bound
        return sorted(queue, key=lambda s: (0 if s.arrival_step <= horizon else s.rank, s.id))

    def queued_tokens_ahead(self) -> tuple[int, int, int]:
        """Prompt tokens a new sequence of rank 0, 1 and 2 would wait behind to be prefilled.

        The ``ready`` ones (prefilled first, whatever their priority) and the
        waiting ones served before it by ``waiting_order``: with priority on,
        those of the same or a lower rank, an aged one as rank 0; off, all of
        them. One pass over the queue: the engine thread publishes this every
        step for the SLO check. A sequence that ages while the new one waits
        is not counted, so with priority on this is a lower bound.
        """
        ready = sum(len(seq.tokens) - seq.num_computed for seq in self.ready)
        if not self.config.priority:
            total = ready + sum(len(seq.tokens) - seq.num_computed for seq in self.waiting)
            return total, total, total
        by_rank = [ready, 0, 0]
        horizon = self.clock - self.config.priority_age_bound
        for seq in self.waiting:
            rank = 0 if seq.arrival_step <= horizon else seq.rank
            by_rank[rank] += len(seq.tokens) - seq.num_computed
        return by_rank[0], by_rank[0] + by_rank[1], by_rank[0] + by_rank[1] + by_rank[2]

    def protection_order(self) -> list[Sequence]:
        """The running sequences, the last the first to be preempted.

        Admission order (the running list's), grouped by priority when it is on.
        """
        if not self.config.priority:
            return list(self.running)
        return sorted(self.running, key=lambda s: s.rank)  # stable: admission order kept

    def abort(self, seq: Sequence) -> None:
        """Drop ``seq`` wherever it is and free its blocks."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
            self.blocks.free(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        elif seq.status is SequenceStatus.REMOTE:
            del self.remote[seq.id]
            self.blocks.free(seq)
        elif seq.status is SequenceStatus.READY:
            self.ready.remove(seq)
            self.blocks.free(seq)
        seq.status = SequenceStatus.FINISHED

    def schedule(self) -> Batch | None:
        """The next step's batch, or ``None`` when nothing can run."""
        if self._decode_due and self.running:
            batch = self._schedule_decode() or self._schedule_prefill()
        else:
            batch = self._schedule_prefill() or self._schedule_decode()
        self._decode_due = False
        if batch is not None:
            self.clock += 1
        return batch

    def _schedule_prefill(self) -> Batch | None:
        cfg = self.config
        seqs: list[Sequence] = []
        ends: list[int] = []
        budget = cfg.max_num_batched_tokens
        # Sequences that already hold their blocks (KV from a prefill worker, or paged
        # back by the prefix tier) first: usually one token each, the last of the prompt.
        # They hold their blocks already, so only the token budget limits them, and the
        # front blocks the rest as in the waiting queue.
        for seq in self.ready_order() if self.ready else ():
            new_tokens = self._piece(seq)
            if seqs and new_tokens > budget:
                break
            budget -= new_tokens
            self.ready.remove(seq)
            seq.status = SequenceStatus.RUNNING
            seq.prefill_tokens += new_tokens
            seqs.append(seq)
            ends.append(seq.num_computed + new_tokens)
        for seq in self.waiting_order() if self.waiting else ():
            if not self._fits(seq, len(seqs)) and not self._preempt_for(seq, len(seqs)):
                break
            verdict = "admit" if self.on_admit is None else self.on_admit(seq, len(seqs))
            if verdict == "taken":  # the hook took it out of the queue (a page-back)
                continue
            if verdict == "wait" or not self._room_for(seq, keep_watermark=bool(self.running)):
                break
            self.blocks.allocate(seq)
            new_tokens = self._piece(seq)
            if seqs and new_tokens > budget:
                self.blocks.free(seq)  # does not fit this step: first in the next one
                break
            budget -= new_tokens
            self.waiting.remove(seq)
            seq.status = SequenceStatus.RUNNING
            seq.prefix_hit_tokens += seq.num_cached
            seq.prefill_tokens += new_tokens
            seqs.append(seq)
            ends.append(seq.num_computed + new_tokens)
        if not seqs:
            return None
        self.running.extend(seqs)
        whole = all(end == len(seq.tokens) for seq, end in zip(seqs, ends, strict=True))
        return Batch(True, seqs, () if whole else tuple(ends))

    def _piece(self, seq: Sequence) -> int:
        """The tokens of ``seq`` to compute in its next prefill step."""
        left = len(seq.tokens) - seq.num_computed
        chunk = self.config.prefill_chunk
        return min(left, chunk) if chunk else left

    def _fits(self, seq: Sequence, batched: int, victims: list[Sequence] | None = None) -> bool:
        """Whether waiting ``seq`` has a slot and its blocks beside ``batched`` new ones,
        with ``victims`` (running) as if preempted."""
        victims = victims or []
        if self.num_holding_slots - len(victims) + batched >= self.config.max_num_seqs:
            return False
        freed = self.blocks.num_freed_by(victims) if victims else 0
        keep = len(self.running) > len(victims)
        return self._room_for(seq, keep_watermark=keep, freed=freed)

    def _preempt_for(self, seq: Sequence, batched: int) -> bool:
        """Preempt the fewest least protected running sequences that make room for ``seq``.

        Only for a sequence served as high, and only sequences neither high nor
        past the age bound are taken; nothing is preempted when even all of them
        would not make room. Whether ``seq`` fits now.
        """
        cfg = self.config
        if not (cfg.priority and cfg.preempt_for_high) or self.effective_rank(seq) != 0:
            return False
        victims: list[Sequence] = []
        for victim in reversed(self.protection_order()):
            if self.effective_rank(victim) == 0:
                continue
            victims.append(victim)
            if self._fits(seq, batched, victims):
                break
        else:
            return False
        for victim in victims:
            self._preempt(victim)
            self.num_priority_preemptions += 1
        return self._fits(seq, batched)

    def _schedule_decode(self) -> Batch | None:
        seqs: list[Sequence] = []
        # The most protected first: a victim is always at or after the sequence
        # that needs its blocks, never one already in this step's batch.
        order = self.protection_order()
        for seq in order:
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted below to make room for a more protected sequence
            while not self.blocks.can_append(seq):
                victim = next(s for s in reversed(order) if s.status is SequenceStatus.RUNNING)
                self._preempt(victim)
                if victim is seq:
                    break
            else:
                self.blocks.append_slot(seq)
                seqs.append(seq)
        return Batch(False, seqs) if seqs else None

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.blocks.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def finish_step(self, batch: Batch, tokens: list[int]) -> list[Sequence]:
        """Append each sequence's new token; free and return the sequences that are done.

        ``tokens`` are ``batch.sampled``'s. A sequence stopped short of its last token
        (a piece of a chunked prefill) goes back to ``ready``, its blocks kept.
        """
        done: list[Sequence] = []
        if batch.ends:
            for seq, end in zip(batch.seqs, batch.ends, strict=True):
                if end < len(seq.tokens):
                    seq.num_computed = end
                    self.blocks.commit(seq)
                    self.running.remove(seq)
                    seq.status = SequenceStatus.READY
                    self.ready.append(seq)
                    self._decode_due = True
        for seq, token in zip(batch.sampled, tokens, strict=True):
            seq.num_computed = len(seq.tokens)
            seq.tokens.append(token)
            self.blocks.commit(seq)
            if seq.is_done:
                done.append(seq)
        for seq in done:
            self.running.remove(seq)
            self.blocks.free(seq)
            seq.status = SequenceStatus.FINISHED
        return done
