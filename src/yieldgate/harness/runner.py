"""Turns a scheduled batch into tensors, runs the model and samples one token per sequence.

Sampling: greedy at temperature 0, else a draw from ``softmax(logits / T)``
(cut to its nucleus when ``top_p`` < 1) with the sequence's own generator,
seeded when it asks. Where sequences ask for log-probabilities, their rows'
``log_softmax`` is taken in one batched call, gathered at the sampled tokens
and cut to the top alternatives; rows that did not ask cost nothing.
"""

from __future__ import annotations

import torch
from torch import Tensor

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
            tokens, positions, attention, last = self._prepare_prefill(batch.seqs)
        else:
            tokens, positions, attention, last = self._prepare_decode(batch.seqs)
        logits = self.model.forward_paged(tokens, positions, self.cache, attention, last)
        chosen = self._sample(batch.seqs, logits)
        self.logprobs = self._logprobs(batch.seqs, logits, chosen)
        return chosen

    def forget(self, seq: Sequence) -> None:
        """Drop per-sequence state (its sampling generator) once it has finished."""
        self._generators.pop(seq.id, None)

    def slots(self, seq: Sequence, num_tokens: int) -> Tensor:
        """The cache slots of ``seq``'s first ``num_tokens`` positions."""
        table = torch.tensor(seq.block_table, device=self.device)
        return (table.unsqueeze(1) * self.block_size + self._offsets).reshape(-1)[:num_tokens]

    def _prepare_prefill(
        self, seqs: list[Sequence]
    ) -> tuple[Tensor, Tensor, AttentionBatch, Tensor]:
        tokens: list[int] = []
        positions: list[int] = []
        starts = [0]
        slot_mapping: list[Tensor] = []
        contexts: list[Tensor] = []
        cached: list[int] = []
        stepwise: list[int] = []
        for seq in seqs:
            start, end = seq.num_computed, len(seq.tokens)
            tokens.extend(seq.tokens[start:end])
            positions.extend(range(start, end))
            starts.append(starts[-1] + end - start)
            slots = self.slots(seq, end)
            slot_mapping.append(slots[start:])
            contexts.append(slots)
            cached.append(start)
            stepwise.append(end - max(start, seq.num_prompt))
        device = self.device
        attention = AttentionBatch(
            is_prefill=True,
            slot_mapping=torch.cat(slot_mapping),
            context_slots=contexts,
            query_starts=starts,
            num_cached=cached,
            num_stepwise=stepwise,
        )
        last = torch.tensor([end - 1 for end in starts[1:]], device=device)
        return (
            torch.tensor(tokens, device=device),
            torch.tensor(positions, device=device),
            attention,
            last,
        )

    def _prepare_decode(
        self, seqs: list[Sequence]
    ) -> tuple[Tensor, Tensor, AttentionBatch, Tensor]:
        device = self.device
        lengths = [len(seq.tokens) for seq in seqs]
        width = max(len(seq.block_table) for seq in seqs)
        tables = torch.tensor(
            [seq.block_table + [0] * (width - len(seq.block_table)) for seq in seqs],
            device=device,
        )
        # Every slot of every block of every sequence, then cut to the longest context.
        slots = (tables.unsqueeze(2) * self.block_size + self._offsets).reshape(len(seqs), -1)
        slots = slots[:, : max(lengths)].contiguous()
        positions, attention = decode_attention(slots, lengths)
        tokens = torch.tensor([seq.tokens[-1] for seq in seqs], device=device)
        last = torch.arange(len(seqs), device=device)
        return tokens, positions, attention, last

    def _sample(self, seqs: list[Sequence], logits: Tensor) -> list[int]:
        chosen: list[int] = logits.argmax(dim=-1).tolist()
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
            chosen[row] = int(torch.multinomial(probs, 1, generator=gen))
        return chosen

    def _logprobs(
        self, seqs: list[Sequence], logits: Tensor, chosen: list[int]
    ) -> list[TokenLogprob | None]:
        rows = [row for row, seq in enumerate(seqs) if seq.params.logprobs is not None]
        out: list[TokenLogprob | None] = [None] * len(seqs)
        if not rows:
            return out
        device = logits.device
        index = torch.tensor(rows, device=device)
        # The distribution each token was drawn from: greedy reports the model's own (T = 1).
        temperatures = torch.tensor(
            [seqs[row].params.temperature or 1.0 for row in rows], device=device
        )
        logp = torch.log_softmax(logits.index_select(0, index).float() / temperatures[:, None], -1)
        sampled = torch.tensor([chosen[row] for row in rows], device=device)
        picked: list[float] = logp.gather(1, sampled[:, None]).squeeze(1).tolist()
        k = max(seqs[row].params.logprobs or 0 for row in rows)
        top_values: list[list[float]] = [[] for _ in rows]
        top_ids: list[list[int]] = [[] for _ in rows]
        if k:
            values, ids = logp.topk(k, dim=-1)
            top_values, top_ids = values.tolist(), ids.tolist()
        for i, row in enumerate(rows):
            n = seqs[row].params.logprobs or 0
            top = tuple(zip(top_ids[i][:n], top_values[i][:n], strict=True))
            out[row] = TokenLogprob(chosen[row], picked[i], top)
        return out


def decode_attention(slots: Tensor, lengths: list[int]) -> tuple[Tensor, AttentionBatch]:
    """One query per row, at the last of its ``lengths[r]`` context slots: ``slots`` holds
    each row's KV slots, padded to the longest context. The queries' positions, and
    the batch that attends over those slots (writing the new KV at the last)."""
    lengths_t = torch.tensor(lengths, device=slots.device)
    longest = slots.shape[1]
    columns = torch.arange(longest, device=slots.device)
    mask = (columns.unsqueeze(0) < lengths_t.unsqueeze(1)).view(len(lengths), 1, 1, longest)
    positions = lengths_t - 1
    attention = AttentionBatch(
        is_prefill=False,
        slot_mapping=slots.gather(1, positions.unsqueeze(1)).squeeze(1),
        context_slots=slots,
        context_mask=mask,
    )
    return positions, attention


def _nucleus(probs: Tensor, top_p: float) -> Tensor:
    """``probs`` with every token outside the smallest most-likely set of mass ``top_p`` zeroed.

    The most likely token always stays; ties are ordered by token id (a
    stable sort), so a seeded draw repeats.
    """
    ordered, order = probs.sort(descending=True, stable=True)
    before = ordered.cumsum(0) - ordered  # the mass of the more likely tokens
    ordered = ordered.masked_fill(before >= top_p, 0.0)
    return torch.zeros_like(probs).scatter_(0, order, ordered)
