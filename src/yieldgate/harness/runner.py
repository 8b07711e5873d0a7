"""Turns a scheduled batch into tensors, runs the model and samples one token per sequence.

Sampling: greedy at temperature 0, else a draw from ``softmax(logits / T)``
(cut to its nucleus when ``top_p`` < 1) with the sequence's own generator,
seeded when it asks. Where sequences ask for log-probabilities, their rows'
``log_softmax`` is taken in one batched call, gathered at the sampled tokens
and cut to the top alternatives; rows that did not ask cost nothing.

A step's tokens and log-probabilities stay on the device until one read at
its end (``_sync.to_host``), and a decode step's index tensors go over in one
copy (``_sync.to_device``): one wait for the device per step.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from yieldgate.harness._sync import to_device, to_host
from yieldgate.harness.model import AttentionBatch, KVCache, TinyTransformer
from yieldgate.harness.scheduler import Batch
from yieldgate.harness.sequence import Sequence, TokenLogprob

__all__ = ["ModelRunner"]


class ModelRunner:
    """Owns the model and the KV cache tensors on one device."""

    def __init__(self, model: TinyTransformer, cache: KVCache) -> None:
        self.model = model
        self.cache = cache
        self.device = model.head.weight.device
        self.block_size = cache.block_size
        self._offsets = torch.arange(self.block_size, device=self.device)
        self._generators: dict[int, torch.Generator] = {}
        # The last run's log-probabilities, one per sequence (``None`` where not asked).
        self.logprobs: list[TokenLogprob | None] = []

    def run(self, batch: Batch) -> list[int]:
        """Compute ``batch`` and return the next token of each of its sequences.

        Their log-probabilities, where asked for, are in ``logprobs`` until the next run.
        """
        self.logprobs = []
        if batch.is_prefill:
            prepared = self._prepare_prefill(batch.seqs, batch.prefill_ends())
        else:
            prepared = self._prepare_decode(batch.seqs)
        tokens, positions, attention, last = prepared
        logits = self.model.forward_paged(tokens, positions, self.cache, attention, last)
        if attention.resident is not None:
            assert self.cache.resident is not None
            self.cache.resident.commit()
        seqs = batch.sampled  # ``last`` holds their rows only
        if not seqs:  # pieces of chunked prefills alone: the KV is written, no token
            return []
        chosen = self.sample(seqs, logits)
        rows, tensors = self.logprob_tensors(seqs, logits, chosen)
        chosen_ids, *read = to_host(chosen, *tensors)
        self.logprobs = logprob_entries(seqs, rows, chosen_ids, read)
        return list(chosen_ids)

    def forget(self, seq: Sequence) -> None:
        """Drop per-sequence state (its sampling generator) once it has finished."""
        self._generators.pop(seq.id, None)

    def slots(self, seq: Sequence, num_tokens: int) -> Tensor:
        """The cache slots of ``seq``'s first ``num_tokens`` positions."""
        table = torch.tensor(seq.block_table, device=self.device)
        return (table.unsqueeze(1) * self.block_size + self._offsets).reshape(-1)[:num_tokens]

    def _prepare_prefill(
        self, seqs: list[Sequence], ends: list[int]
    ) -> tuple[Tensor, Tensor, AttentionBatch, Tensor]:
        tokens: list[int] = []
        positions: list[int] = []
        starts = [0]
        slot_mapping: list[Tensor] = []
        contexts: list[Tensor] = []
        cached: list[int] = []
        stepwise: list[int] = []
        last: list[int] = []  # the rows of the sequences that get a token
        for seq, end in zip(seqs, ends, strict=True):
            start = seq.num_computed
            tokens.extend(seq.tokens[start:end])
            positions.extend(range(start, end))
            starts.append(starts[-1] + end - start)
            slots = self.slots(seq, end)
            slot_mapping.append(slots[start:])
            contexts.append(slots)
            cached.append(start)
            stepwise.append(max(0, end - max(start, seq.num_prompt)))
            if end == len(seq.tokens):
                last.append(starts[-1] - 1)
        device = self.device
        attention = AttentionBatch(
            is_prefill=True,
            slot_mapping=torch.cat(slot_mapping),
            context_slots=contexts,
            query_starts=starts,
            num_cached=cached,
            num_stepwise=stepwise,
        )
        return (
            torch.tensor(tokens, device=device),
            torch.tensor(positions, device=device),
            attention,
            torch.tensor(last, dtype=torch.long, device=device),
        )

    def _prepare_decode(
        self, seqs: list[Sequence]
    ) -> tuple[Tensor, Tensor, AttentionBatch, Tensor]:
        device, size = self.device, self.block_size
        # Each new token's position (its sequence's last) and cache slot, on the host.
        positions = [len(seq.tokens) - 1 for seq in seqs]
        slots = [
            seq.block_table[p // size] * size + p % size
            for seq, p in zip(seqs, positions, strict=True)
        ]
        # The blocks that hold the longest context (a table may hold more).
        width = max(positions) // size + 1
        padded = [block for seq in seqs for block in pad(seq.block_table[:width], width)]
        tables, tokens, positions_t, slots_t = to_device(
            [padded, [seq.tokens[-1] for seq in seqs], positions, slots], device
        )
        tables = tables.view(len(seqs), width)
        attention = decode_attention_by_block(tables, positions_t, slots_t, size)
        if self.cache.resident is not None:
            assert attention.context_mask is not None
            attention.resident = self.cache.resident.step(
                self.cache.blocked,
                [seq.id for seq in seqs],
                [seq.block_table for seq in seqs],
                positions,
                tables,
                attention.context_mask,
            )
        last = torch.arange(len(seqs), device=device)
        return tokens, positions_t, attention, last

    def sample(self, seqs: list[Sequence], logits: Tensor) -> Tensor:
        """Each row's next token, on the device: argmax, or a draw where it samples."""
        chosen = logits.argmax(dim=-1)
        for row, seq in enumerate(seqs):
            temperature = seq.params.temperature
            if temperature == 0:
                continue
            gen = self._generators.get(seq.id)
            if gen is None:
                gen = torch.Generator(device=self.device)
                if seq.params.seed is None:
                    gen.seed()
                else:
                    gen.manual_seed(seq.params.seed)
                self._generators[seq.id] = gen
            probs = torch.softmax(logits[row].float() / temperature, dim=-1)
            if seq.params.top_p < 1:
                probs = _nucleus(probs, seq.params.top_p)
            # Written in place on the device: the draw is read with the step's other tokens.
            chosen[row : row + 1] = torch.multinomial(probs, 1, generator=gen)
        return chosen

    def logprob_tensors(
        self, seqs: list[Sequence], logits: Tensor, chosen: Tensor
    ) -> tuple[list[int], list[Tensor]]:
        """The rows that asked for log-probabilities, and theirs on the device (none: ``[]``).

        The tensors are the sampled tokens' log-probabilities, then, when any
        row asked for alternatives, the top values and their ids; read them
        with the step's tokens and give them to ``logprob_entries``.
        """
        rows = [row for row, seq in enumerate(seqs) if seq.params.logprobs is not None]
        if not rows:
            return rows, []
        # The distribution each token was drawn from: greedy reports the model's own (T = 1).
        temperatures = [seqs[row].params.temperature or 1.0 for row in rows]
        # One copy: the row numbers ride along as floats (exact far beyond any batch).
        (packed,) = to_device([rows + temperatures], logits.device, torch.float32)
        index, divisor = packed[: len(rows)].long(), packed[len(rows) :]
        logp = torch.log_softmax(logits.index_select(0, index).float() / divisor[:, None], -1)
        picked = logp.gather(1, chosen.index_select(0, index)[:, None]).squeeze(1)
        k = max(seqs[row].params.logprobs or 0 for row in rows)
        if not k:
            return rows, [picked]
        values, ids = logp.topk(k, dim=-1)
        return rows, [picked, values, ids]


def logprob_entries(
    seqs: list[Sequence], rows: list[int], chosen: list[int], read: list[Any]
) -> list[TokenLogprob | None]:
    """``ModelRunner.logprob_tensors``' output, read (``read``), as one entry per sequence."""
    out: list[TokenLogprob | None] = [None] * len(seqs)
    if not rows:
        return out
    picked: list[float] = read[0]
    top_values: list[list[float]] = read[1] if len(read) > 1 else [[] for _ in rows]
    top_ids: list[list[int]] = read[2] if len(read) > 1 else [[] for _ in rows]
    for i, row in enumerate(rows):
        n = seqs[row].params.logprobs or 0
        top = tuple(zip(top_ids[i][:n], top_values[i][:n], strict=True))
        out[row] = TokenLogprob(chosen[row], picked[i], top)
    return out


def pad(table: list[int], width: int) -> list[int]:
    """A block table padded with block 0 to ``width`` (the padding is masked, never read)."""
    return table + [0] * (width - len(table))


def decode_attention(slots: Tensor, lengths: Tensor) -> tuple[Tensor, AttentionBatch]:
    """One query per row, at the last of its ``lengths[r]`` context slots: ``slots`` holds
    each row's KV slots, padded to the longest context. The queries' positions, and
    the batch that attends over those slots (writing the new KV at the last)."""
    rows, longest = slots.shape
    columns = torch.arange(longest, device=slots.device)
    mask = (columns.unsqueeze(0) < lengths.unsqueeze(1)).view(rows, 1, 1, longest)
    positions = lengths - 1
    attention = AttentionBatch(
        is_prefill=False,
        slot_mapping=slots.gather(1, positions.unsqueeze(1)).squeeze(1),
        context_slots=slots,
        context_mask=mask,
    )
    return positions, attention


def decode_attention_by_block(
    tables: Tensor, positions: Tensor, slots: Tensor, block_size: int
) -> AttentionBatch:
    """One query per row, at ``positions[r]``, its new KV written at ``slots[r]``,
    attending over its blocks ``tables`` (``(rows, blocks)``, padded) up to its
    position: the model gathers whole blocks, and the mask covers every slot of
    them, the last block's unused tail and the padding false."""
    rows, width = tables.shape
    columns = torch.arange(width * block_size, device=tables.device)
    mask = (columns.unsqueeze(0) <= positions.unsqueeze(1)).view(rows, 1, 1, -1)
    return AttentionBatch(
        is_prefill=False, slot_mapping=slots, context_blocks=tables, context_mask=mask
    )


def _nucleus(probs: Tensor, top_p: float) -> Tensor:
    """``probs`` with every token outside the smallest most-likely set of mass ``top_p`` zeroed.

    The most likely token always stays; ties are ordered by token id (a
    stable sort), so a seeded draw repeats.
    """
    ordered, order = probs.sort(descending=True, stable=True)
    before = ordered.cumsum(0) - ordered  # the mass of the more likely tokens
    ordered = ordered.masked_fill(before >= top_p, 0.0)
    return torch.zeros_like(probs).scatter_(0, order, ordered)
