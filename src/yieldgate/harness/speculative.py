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
   layer has just written, and keeps its own key in a scratch slot. The
   branches are chosen on the device and the step verifies a fixed number
   of branch rows (``max_extra_tokens`` or one per drafting sequence, if
   fewer; rows past the candidates are computed and ignored), so that the
   host never waits for the drafts before the verify.
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

import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from yieldgate.harness._draft_model import DraftModel
from yieldgate.harness._speculative_config import SpeculativeConfig
from yieldgate.harness._sync import to_device, to_host
from yieldgate.harness.block_manager import BlockManager
from yieldgate.harness.model import AttentionBatch, KVCache, TinyTransformer
from yieldgate.harness.runner import ModelRunner, decode_attention, logprob_entries, pad
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
        """Decode ``batch`` (a scheduled decode batch) by one or more tokens per sequence.

        The host waits for the device once, after the verify forward: drafts,
        branches, verdicts and plain rows' samples are read together.
        """
        seqs = batch.seqs
        started = time.perf_counter()
        ks = [self._lookahead(seq) for seq in seqs]
        inputs = self._inputs(seqs, ks)
        scratch = Sequence(-1, [0], SamplingParams())
        try:
            # Branch rows verified this step: a fixed number, chosen on the device,
            # so that the verify's shape does not wait for the drafts to be read.
            wanted = 0
            if self.config.branch_threshold > 0:
                wanted = min(self.config.max_extra_tokens, sum(1 for k in ks if k))
            extra = self.blocks.grow(scratch, wanted) if wanted else 0
            drafted = self._draft(seqs, ks, inputs)
            picked = self._pick_branches(ks, inputs, drafted, extra) if drafted else None
            drafted_at = time.perf_counter()
            kept, logprobs = self._verify(seqs, ks, inputs, drafted, picked, scratch)
        finally:
            self.blocks.shrink(scratch, 0)
        self.draft_s += drafted_at - started
        self.verify_s += time.perf_counter() - drafted_at
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

    def _inputs(self, seqs: list[Sequence], ks: list[int]) -> _Inputs:
        """The step's index tensors, made in one copy to the device."""
        width = max(len(seq.block_table) for seq in seqs)
        active = [[i for i, k in enumerate(ks) if k > j] for j in range(max(ks, default=0))]
        tables, last, lengths, ks_t, *rows = to_device(
            [
                [block for seq in seqs for block in pad(seq.block_table, width)],
                [seq.tokens[-1] for seq in seqs],
                [len(seq.tokens) for seq in seqs],
                ks,
                *active,
            ],
            self.device,
        )
        slots = tables.view(len(seqs), width, 1) * self.block_size + self._offsets
        return _Inputs(slots.reshape(len(seqs), -1), last, lengths, ks_t, rows)

    def _draft(
        self, seqs: list[Sequence], ks: list[int], inputs: _Inputs
    ) -> tuple[Tensor, Tensor, Tensor] | None:
        """Draft on the device, with no wait: per step and row, the draft's token,
        its probability and the second choice (``(steps, rows)`` each)."""
        steps = len(inputs.rows)
        if not steps:
            return None
        shape = (steps, len(seqs))
        tokens = torch.zeros(shape, dtype=torch.int64, device=self.device)
        top1 = torch.zeros(shape, dtype=torch.float32, device=self.device)
        second = torch.zeros_like(tokens)
        for j, rows in enumerate(inputs.rows):
            # The context of each row, this step's token included.
            longest = max(len(seq.tokens) + j for seq, k in zip(seqs, ks, strict=True) if k > j)
            matrix = inputs.slots.index_select(0, rows)[:, :longest].contiguous()
            positions, attention = decode_attention(
                matrix, inputs.lengths.index_select(0, rows) + j
            )
            previous = inputs.last if j == 0 else tokens[j - 1]
            logits = self.draft.forward_paged(
                previous.index_select(0, rows), positions, self.cache, attention
            )
            top = torch.softmax(logits.float(), dim=-1).topk(2, dim=-1)
            tokens[j].index_copy_(0, rows, top.indices[:, 0])
            top1[j].index_copy_(0, rows, top.values[:, 0])
            second[j].index_copy_(0, rows, top.indices[:, 1])
        self.drafted += sum(ks)
        return tokens, top1, second

    def _pick_branches(
        self,
        ks: list[int],
        inputs: _Inputs,
        drafted: tuple[Tensor, Tensor, Tensor],
        count: int,
    ) -> tuple[Tensor, ...] | None:
        """``count`` branch rows, chosen on the device: per sequence its first draft
        position below ``branch_threshold``, the least confident sequences first.

        Returns, per branch row, the sequence's row, the draft position it
        replaces, its token (the draft's second choice), its confidence and
        whether it is real (a row past the candidates is computed and ignored).
        """
        if not count:
            return None
        _, top1, second = drafted
        steps = torch.arange(top1.shape[0], device=self.device).unsqueeze(1)
        below = (top1 < self.config.branch_threshold) & (steps < inputs.ks.unsqueeze(0))
        real = below.any(0)
        first = below.to(torch.int8).argmax(0)  # the first position below, per row
        confidence = top1.gather(0, first.unsqueeze(0)).squeeze(0)
        key = torch.where(real, confidence, torch.inf)
        rows = torch.sort(key, stable=True).indices[:count]
        token = second.gather(0, first.unsqueeze(0)).squeeze(0)
        return (
            rows,
            first.index_select(0, rows),
            token.index_select(0, rows),
            confidence.index_select(0, rows),
            real.index_select(0, rows),
        )

    def _grid_attention(
        self, matrix: Tensor, first: Tensor, counts: list[int], slot_mapping: Tensor
    ) -> AttentionBatch:
        """Every row's queries on one padded grid: query ``q`` of row ``r`` sits at
        position ``first[r] + q`` and sees its context (``matrix[r]``) up to there."""
        device = self.device
        width = max(counts)
        queries = torch.arange(width, device=device)
        columns = torch.arange(matrix.shape[1], device=device)
        # Which grid cells are real queries: from the host, as a device-side
        # ``masked_select`` would wait for the device to learn its length.
        (index,) = to_device(
            [[r * width + q for r, c in enumerate(counts) for q in range(c)]], device
        )
        valid = torch.zeros(len(counts) * width, dtype=torch.bool, device=device)
        valid = valid.index_fill_(0, index, True).view(len(counts), width)
        limit = first.view(-1, 1, 1) + queries.view(1, -1, 1)
        mask = (columns.view(1, 1, -1) <= limit) & valid.unsqueeze(2)
        # A padding query sees one slot, so that its (discarded) softmax is not empty.
        mask |= (~valid).unsqueeze(2) & (columns == 0)
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
        ks: list[int],
        inputs: _Inputs,
        drafted: tuple[Tensor, Tensor, Tensor] | None,
        picked: tuple[Tensor, ...] | None,
        scratch: Sequence,
    ) -> tuple[list[list[int]], list[list[TokenLogprob | None]]]:
        n = len(seqs)
        positions: list[int] = []
        slot_mapping: list[int] = []
        first: list[int] = []
        source: list[int] = []  # each new token's index in (last tokens, drafts)
        starts = [0]
        for i, (seq, k) in enumerate(zip(seqs, ks, strict=True)):
            m = len(seq.tokens)
            positions += range(m - 1, m + k)
            slot_mapping += (self._slot(seq.block_table, p) for p in range(m - 1, m + k))
            first.append(m - 1)
            source += [i, *(n + j * n + i for j in range(k))]
            starts.append(starts[-1] + 1 + k)
        extra = 0 if picked is None else picked[0].shape[0]
        scratch_slots = [self._slot(scratch.block_table, b) for b in range(extra)]
        plain = [i for i, k in enumerate(ks) if not k]
        uploaded = to_device(
            [
                positions,
                slot_mapping + scratch_slots,
                first,
                source,
                scratch_slots,
                [starts[i] for i in plain],
            ],
            self.device,
        )
        positions_t, slots_t, first_t, source_t, scratch_t, plain_t = uploaded
        pool = [inputs.last] + ([drafted[0].reshape(-1)] if drafted is not None else [])
        tokens = torch.cat(pool).index_select(0, source_t)
        longest = max(len(seq.tokens) + k for seq, k in zip(seqs, ks, strict=True))
        matrix = inputs.slots[:, :longest]
        if picked is not None:
            # A branch row sees its sequence's slots up to the position it replaces,
            # where its own key sits in a scratch slot. (A row that is no real
            # branch is clamped into the grid; its output is ignored.)
            rows, index, token = picked[0], picked[1], picked[2]
            at = (inputs.lengths.index_select(0, rows) + index).clamp_(max=longest - 1)
            own = matrix.index_select(0, rows).scatter(1, at.unsqueeze(1), scratch_t.unsqueeze(1))
            matrix = torch.cat((matrix, own))
            tokens = torch.cat((tokens, token))
            positions_t = torch.cat((positions_t, at))
            first_t = torch.cat((first_t, at))
        counts = [1 + k for k in ks] + [1] * extra
        attention = self._grid_attention(matrix.contiguous(), first_t, counts, slots_t)
        logits = self.model.forward_paged(
            tokens,
            positions_t,
            self.cache,
            attention,
            torch.arange(len(positions) + extra, device=self.device),
        )
        reads = [logits.argmax(dim=-1)]
        if drafted is not None:
            reads.append(drafted[0])
        if picked is not None:
            reads += picked
        plain_seqs = [seqs[i] for i in plain]
        lp_rows: list[int] = []
        if plain:
            # Not speculated: sampled (or argmax) from its one row, as plain decoding does.
            plain_logits = logits.index_select(0, plain_t)
            chosen_t = self.runner.sample(plain_seqs, plain_logits)
            lp_rows, lp_tensors = self.runner.logprob_tensors(plain_seqs, plain_logits, chosen_t)
            reads += [chosen_t, *lp_tensors]
            self.plain_rows += len(plain)
        read = to_host(*reads)  # the step's one wait for the device
        greedy: list[int] = read.pop(0)
        drafts = _rows(read.pop(0), ks) if drafted is not None else [[] for _ in seqs]
        branches: dict[int, tuple[int, _Branch]] = {}
        if picked is not None:
            b_rows, b_index, b_token, b_confidence, b_real = (read.pop(0) for _ in range(5))
            for b in range(extra):
                if b_real[b]:
                    branch = _Branch(b_rows[b], b_index[b], b_token[b], b_confidence[b])
                    branches[branch.row] = (b, branch)
        chosen: list[int] = read.pop(0) if plain else []
        plain_logprobs = logprob_entries(plain_seqs, lp_rows, chosen, read)
        return self._accept(
            seqs, drafts, branches, scratch_slots, greedy, starts, chosen, plain_logprobs
        )

    def _accept(
        self,
        seqs: list[Sequence],
        drafts: list[list[int]],
        by_row: dict[int, tuple[int, _Branch]],
        scratch_slots: list[int],
        greedy: list[int],
        starts: list[int],
        chosen: list[int],
        plain_logprobs: list[TokenLogprob | None],
    ) -> tuple[list[list[int]], list[list[TokenLogprob | None]]]:
        """What each sequence keeps: the drafts the target agreed with, then its own token."""
        kept: list[list[int]] = []
        logprobs: list[list[TokenLogprob | None]] = []
        plain_at = {i: n for n, i in enumerate(i for i, draft in enumerate(drafts) if not draft)}
        copies: list[tuple[int, int]] = []  # (scratch slot, the sequence's slot)
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
                    at = len(seqs[i].tokens) + accepted
                    copies.append((scratch_slots[b], self._slot(seqs[i].block_table, at)))
                    out += [branch.token, greedy[starts[len(seqs)] + b]]
                    kept.append(out)
                    logprobs.append([None] * len(out))
                    continue
            out.append(row[accepted])
            kept.append(out)
            logprobs.append([None] * len(out))
        if copies:
            # The branch's key and value, written in a scratch slot, become the sequence's.
            src, dst = to_device([[c[0] for c in copies], [c[1] for c in copies]], self.device)
            self.cache.written(dst)
            self.cache.k.index_copy_(1, dst, self.cache.k.index_select(1, src))
            self.cache.v.index_copy_(1, dst, self.cache.v.index_select(1, src))
        return kept, logprobs

    def _slot(self, table: list[int], position: int) -> int:
        """The cache slot of ``position`` in a sequence with block table ``table``."""
        return table[position // self.block_size] * self.block_size + position % self.block_size


@dataclass(slots=True)
class _Inputs:
    """A step's index tensors on the device (``Speculator._inputs``)."""

    slots: Tensor  # (rows, blocks * block_size): every slot of each row's blocks
    last: Tensor  # (rows,): each row's last token
    lengths: Tensor  # (rows,): each row's tokens
    ks: Tensor  # (rows,): how many tokens each row drafts
    rows: list[Tensor]  # per draft step, the rows that draft at it


def _rows(tokens: list[list[int]], ks: list[int]) -> list[list[int]]:
    """Per row, its ``ks[row]`` drafts, from ``(steps, rows)`` lists."""
    return [[tokens[j][i] for j in range(k)] for i, k in enumerate(ks)]
