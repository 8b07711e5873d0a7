"""Speculative decoding with branches: a cheap draft proposes, the target verifies.

The draft is the target's own first ``draft_layers`` layers with an exit
head of its own (a layer norm and a linear layer). Because its layers *are*
the target's, the keys and values it needs are already in the target's
paged KV cache: the draft has no cache, no prefill and no weights to load
beyond its head. The head starts as a copy of the target's final norm and
head, and is distilled for a few seconds on the target's own greedy output
(random weights give a naive early exit little agreement with the full
model; see ``docs/harness.md``).

One speculative decode step, for the greedy sequences of a decode batch:

1. *Lookahead blocks.* Each sequence drafts up to ``k`` tokens, fewer near
   its ``max_tokens`` or when no KV block is left for the lookahead
   (speculation never preempts or waits for memory; it shrinks to plain
   decoding).
2. *Draft.* ``k`` batched forwards through the first layers, one token each.
   Where the draft's top-1 probability is below ``branch_threshold``, the
   first such position of a sequence becomes a branch candidate: its
   second choice.
3. *Verify.* One multi-token forward of the target over the paged cache
   (every row's queries on one padded grid, a causal mask per row): per
   sequence its last token and its drafts, plus one extra row per branch
   (at most ``max_extra_tokens``, the least confident first). A branch row
   attends over the main row's keys up to the divergence, which the same
   layer has just written, and keeps its own key in a scratch slot.
4. *Accept.* The longest prefix of drafts equal to the target's greedy
   choices is kept, then the target's own next token; where the draft went
   wrong exactly at a branch and the branch's token is the target's choice,
   the branch's token and the target's token after it are kept instead
   (its key and value are copied into the sequence's slot). Every kept
   token is the target's greedy choice, so the output is the one plain
   decoding gives.
5. *Roll back.* The KV slots of rejected positions are simply not counted
   (``num_computed`` stops at the last kept token; later tokens overwrite
   them) and lookahead blocks past the kept tokens go back to the pool.

Sequences that sample (``temperature > 0``) or ask for log-probabilities
are not speculated: they take one row of the same verify forward and are
sampled by the runner as a plain decode step would.

Here: the ``Speculator`` (one speculative step). The draft and its
distillation are ``_draft_model``, the options ``_speculative_config``; both
``DraftModel`` and ``SpeculativeConfig`` are re-exported here.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from yieldgate.harness._draft_model import DraftModel
from yieldgate.harness._speculative_config import SpeculativeConfig
from yieldgate.harness.block_manager import BlockManager
from yieldgate.harness.model import AttentionBatch, KVCache, TinyTransformer
from yieldgate.harness.runner import ModelRunner, decode_attention
from yieldgate.harness.scheduler import Batch, Scheduler
from yieldgate.harness.sequence import SamplingParams, Sequence, TokenLogprob

__all__ = ["DraftModel", "SpeculativeConfig", "SpeculativeStep", "Speculator"]


@dataclass(frozen=True, slots=True)
class SpeculativeStep:
    """One step's outcome: per sequence of the batch, the tokens it kept, in order."""

    tokens: list[list[int]]
    logprobs: list[list[TokenLogprob | None]]
    finished: list[Sequence]


@dataclass(slots=True)
class _Branch:
    row: int  # the sequence's index in the batch
    index: int  # which draft it replaces
    token: int
    confidence: float


class Speculator:
    """Runs decode batches speculatively over an engine's model, cache, blocks and runner."""

    def __init__(
        self,
        config: SpeculativeConfig,
        *,
        model: TinyTransformer,
        cache: KVCache,
        blocks: BlockManager,
        scheduler: Scheduler,
        runner: ModelRunner,
    ) -> None:
        self.config = config
        self.model = model
        self.cache = cache
        self.blocks = blocks
        self.scheduler = scheduler
        self.runner = runner
        self.device = model.head.weight.device
        self.block_size = cache.block_size
        self._offsets = torch.arange(self.block_size, device=self.device)
        self.draft = DraftModel(model, config.draft_layers)
        self.distillation: dict[str, float] = {}
        if config.distill_steps:
            self.distillation = self.draft.distill(config)
        self.reset_counters()

    def reset_counters(self) -> None:
        self.num_steps = 0
        self.drafted = 0
        self.accepted = 0
        self.branches = 0
        self.branch_hits = 0
        self.extra_tokens = 0
        self.emitted = 0
        self.rows = 0
        self.plain_rows = 0
        self.draft_s = 0.0
        self.verify_s = 0.0

    def stats(self) -> dict[str, Any]:
        return {
            "spec_steps": self.num_steps,
            "spec_drafted": self.drafted,
            "spec_accepted": self.accepted,
            "spec_acceptance_rate": self.accepted / self.drafted if self.drafted else None,
            "spec_branches": self.branches,
            "spec_branch_hits": self.branch_hits,
            "spec_extra_tokens": self.extra_tokens,
            # Tokens a sequence gains per decode step (1.0 is plain decoding).
            "spec_tokens_per_seq_step": self.emitted / self.rows if self.rows else None,
            "spec_plain_rows": self.plain_rows,
            # Where a step's time goes: drafting, and the target's verify forward.
            "spec_draft_ms_per_step": (
                self.draft_s * 1000 / self.num_steps if self.num_steps else None
            ),
            "spec_verify_ms_per_step": (
                self.verify_s * 1000 / self.num_steps if self.num_steps else None
            ),
        }

    # -- the step -------------------------------------------------------------

    def step(self, batch: Batch) -> SpeculativeStep:
        """Decode ``batch`` (a scheduled decode batch) by one or more tokens per sequence."""
        seqs = batch.seqs
        started = time.perf_counter()
        ks = [self._lookahead(seq) for seq in seqs]
        drafts, branches = self._draft(seqs, ks)
        drafted = time.perf_counter()
        scratch = Sequence(-1, [0], SamplingParams())
        branches = self._scratch_for(scratch, branches)
        try:
            kept, logprobs = self._verify(seqs, drafts, branches, scratch)
        finally:
            self.blocks.shrink(scratch, 0)
        self.draft_s += drafted - started
        self.verify_s += time.perf_counter() - drafted
        finished: list[Sequence] = []
        for seq, tokens in zip(seqs, kept, strict=True):
            self.blocks.shrink(seq, len(seq.tokens) + len(tokens))
        for r in range(max(len(tokens) for tokens in kept)):
            rows = [i for i, tokens in enumerate(kept) if len(tokens) > r]
            finished += self.scheduler.finish_step(
                Batch(False, [seqs[i] for i in rows]), [kept[i][r] for i in rows]
            )
        self.num_steps += 1
        self.emitted += sum(len(tokens) for tokens in kept)
        self.rows += len(seqs)
        return SpeculativeStep(tokens=kept, logprobs=logprobs, finished=finished)

    def _lookahead(self, seq: Sequence) -> int:
        """How many tokens ``seq`` drafts this step, with the KV slots for them reserved."""
        params = seq.params
        if params.temperature != 0 or params.logprobs is not None:
            return 0
        k = min(self.config.k, params.max_tokens - seq.num_output - 1)
        if k <= 0:
            return 0
        n = len(seq.tokens)
        return self.blocks.grow(seq, n + k) - n

    def _slots(self, seq: Sequence) -> Tensor:
        table = torch.tensor(seq.block_table, device=self.device)
        return (table.unsqueeze(1) * self.block_size + self._offsets).reshape(-1)

    def _draft(self, seqs: list[Sequence], ks: list[int]) -> tuple[list[list[int]], list[_Branch]]:
        drafts: list[list[int]] = [[] for _ in seqs]
        candidates: dict[int, _Branch] = {}
        threshold = self.config.branch_threshold
        device = self.device
        slots = {i: self._slots(seqs[i]) for i, k in enumerate(ks) if k}
        for j in range(max(ks, default=0)):
            rows = [i for i, k in enumerate(ks) if k > j]
            lengths = [len(seqs[i].tokens) + j for i in rows]  # context, this token included
            longest = max(lengths)
            matrix = torch.stack(
                [
                    F.pad(slots[i][:longest], (0, longest - min(longest, len(slots[i]))))
                    for i in rows
                ]
            )
            positions, attention = decode_attention(matrix, lengths)
            tokens = torch.tensor(
                [drafts[i][-1] if j else seqs[i].tokens[-1] for i in rows], device=device
            )
            logits = self.draft.forward_paged(tokens, positions, self.cache, attention)
            top = torch.softmax(logits.float(), dim=-1).topk(2, dim=-1)
            values: list[list[float]] = top.values.tolist()
            indices: list[list[int]] = top.indices.tolist()
            for n, i in enumerate(rows):
                drafts[i].append(indices[n][0])
                if values[n][0] < threshold and i not in candidates:
                    candidates[i] = _Branch(i, j, indices[n][1], values[n][0])
        self.drafted += sum(ks)
        chosen = sorted(candidates.values(), key=lambda b: b.confidence)
        return drafts, chosen[: self.config.max_extra_tokens]

    def _scratch_for(self, scratch: Sequence, branches: list[_Branch]) -> list[_Branch]:
        """Scratch KV slots for the branch rows; as many branches as slots could be had."""
        if not branches:
            return branches
        return branches[: self.blocks.grow(scratch, len(branches))]

    def _grid_attention(
        self, contexts: list[Tensor], first: list[int], starts: list[int], slot_mapping: Tensor
    ) -> AttentionBatch:
        """Every row's queries on one padded grid: query ``q`` of row ``r`` sits at
        position ``first[r] + q`` and sees its context up to there."""
        device = self.device
        rows = len(contexts)
        counts = torch.tensor([hi - lo for lo, hi in itertools.pairwise(starts)], device=device)
        width = int(counts.max())
        matrix = nn.utils.rnn.pad_sequence(contexts, batch_first=True)
        queries = torch.arange(width, device=device)
        columns = torch.arange(matrix.shape[1], device=device)
        valid = queries.unsqueeze(0) < counts.unsqueeze(1)
        limit = torch.tensor(first, device=device).view(-1, 1, 1) + queries.view(1, -1, 1)
        mask = (columns.view(1, 1, -1) <= limit) & valid.unsqueeze(2)
        # A padding query sees one slot, so that its (discarded) softmax is not empty.
        mask |= (~valid).unsqueeze(2) & (columns == 0)
        index = (torch.arange(rows, device=device).unsqueeze(1) * width + queries).masked_select(
            valid
        )
        return AttentionBatch(
            is_prefill=False,
            slot_mapping=slot_mapping,
            context_slots=matrix,
            context_mask=mask.unsqueeze(1),
            query_index=index,
        )

    def _verify(
        self,
        seqs: list[Sequence],
        drafts: list[list[int]],
        branches: list[_Branch],
        scratch: Sequence,
    ) -> tuple[list[list[int]], list[list[TokenLogprob | None]]]:
        device = self.device
        tokens: list[int] = []
        positions: list[int] = []
        starts = [0]
        slot_mapping: list[Tensor] = []
        contexts: list[Tensor] = []
        cached: list[int] = []
        own_slots: list[Tensor] = []
        for seq, draft in zip(seqs, drafts, strict=True):
            n = len(seq.tokens)
            slots = self._slots(seq)[: n + len(draft)]
            own_slots.append(slots)
            tokens += [seq.tokens[-1], *draft]
            positions += range(n - 1, n + len(draft))
            starts.append(starts[-1] + 1 + len(draft))
            slot_mapping.append(slots[n - 1 :])
            contexts.append(slots)
            cached.append(n - 1)
        scratch_slots = self._slots(scratch) if branches else None
        for b, branch in enumerate(branches):
            assert scratch_slots is not None
            at = len(seqs[branch.row].tokens) + branch.index  # the position it replaces
            tokens.append(branch.token)
            positions.append(at)
            starts.append(starts[-1] + 1)
            slot = scratch_slots[b : b + 1]
            slot_mapping.append(slot)
            contexts.append(torch.cat((own_slots[branch.row][:at], slot)))
            cached.append(at)
        attention = self._grid_attention(contexts, cached, starts, torch.cat(slot_mapping))
        logits = self.model.forward_paged(
            torch.tensor(tokens, device=device),
            torch.tensor(positions, device=device),
            self.cache,
            attention,
            torch.arange(len(tokens), device=device),
        )
        greedy: list[int] = logits.argmax(dim=-1).tolist()
        kept: list[list[int]] = []
        logprobs: list[list[TokenLogprob | None]] = []
        plain = [i for i, draft in enumerate(drafts) if not draft]
        if plain:
            # Not speculated: sampled (or argmax) from its one row, as plain decoding does.
            rows = torch.tensor([starts[i] for i in plain], device=device)
            plain_seqs = [seqs[i] for i in plain]
            plain_logits = logits.index_select(0, rows)
            chosen = self.runner._sample(plain_seqs, plain_logits)
            plain_logprobs = self.runner._logprobs(plain_seqs, plain_logits, chosen)
            self.plain_rows += len(plain)
        by_row = {branch.row: (b, branch) for b, branch in enumerate(branches)}
        plain_at = {i: n for n, i in enumerate(plain)}
        for i, draft in enumerate(drafts):
            if not draft:
                n = plain_at[i]
                kept.append([chosen[n]])
                logprobs.append([plain_logprobs[n]])
                continue
            row = greedy[starts[i] : starts[i + 1]]
            accepted = 0
            while accepted < len(draft) and draft[accepted] == row[accepted]:
                accepted += 1
            self.accepted += accepted
            out = draft[:accepted]
            hit = by_row.get(i)
            if hit is not None:
                b, branch = hit
                self.branches += 1
                self.extra_tokens += 1
                if branch.index == accepted and branch.token == row[accepted]:
                    # The draft's second choice was the target's: keep it and the token after.
                    self.branch_hits += 1
                    assert scratch_slots is not None
                    at = len(seqs[i].tokens) + accepted
                    src, dst = scratch_slots[b : b + 1], own_slots[i][at : at + 1]
                    self.cache.k.index_copy_(1, dst, self.cache.k.index_select(1, src))
                    self.cache.v.index_copy_(1, dst, self.cache.v.index_select(1, src))
                    out += [branch.token, greedy[starts[len(seqs)] + b]]
                    kept.append(out)
                    logprobs.append([None] * len(out))
                    continue
            out.append(row[accepted])
            kept.append(out)
            logprobs.append([None] * len(out))
        return kept, logprobs
