"""Turns a scheduled batch into tensors, runs the model and samples one token per sequence."""

from __future__ import annotations

import torch
from torch import Tensor

from yieldgate.harness.model import AttentionBatch, KVCache, TinyTransformer
from yieldgate.harness.scheduler import Batch
from yieldgate.harness.sequence import Sequence

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

    def run(self, batch: Batch) -> list[int]:
        """Compute ``batch`` and return the next token of each of its sequences."""
        if batch.is_prefill:
            tokens, positions, attention, last = self._prepare_prefill(batch.seqs)
        else:
            tokens, positions, attention, last = self._prepare_decode(batch.seqs)
        logits = self.model.forward_paged(tokens, positions, self.cache, attention, last)
        return self._sample(batch.seqs, logits)

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
        for seq in seqs:
            start, end = seq.num_computed, len(seq.tokens)
            tokens.extend(seq.tokens[start:end])
            positions.extend(range(start, end))
            starts.append(starts[-1] + end - start)
            slots = self.slots(seq, end)
            slot_mapping.append(slots[start:])
            contexts.append(slots)
            cached.append(start)
        device = self.device
        attention = AttentionBatch(
            is_prefill=True,
            slot_mapping=torch.cat(slot_mapping),
            context_slots=contexts,
            query_starts=starts,
            num_cached=cached,
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
        longest = max(lengths)
        slots = slots[:, :longest].contiguous()
        lengths_t = torch.tensor(lengths, device=device)
        columns = torch.arange(longest, device=device)
        mask = (columns.unsqueeze(0) < lengths_t.unsqueeze(1)).view(len(seqs), 1, 1, longest)
        positions = lengths_t - 1
        attention = AttentionBatch(
            is_prefill=False,
            slot_mapping=slots.gather(1, positions.unsqueeze(1)).squeeze(1),
            context_slots=slots,
            context_mask=mask,
        )
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
            chosen[row] = int(torch.multinomial(probs, 1, generator=gen))
        return chosen
