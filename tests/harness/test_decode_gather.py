"""Decode attention gathers its context by block: the same keys, values and logits as by slot."""

from __future__ import annotations

import copy

import pytest
import torch

from yieldgate.harness.model import AttentionBatch, KVCache, ModelConfig, TinyTransformer
from yieldgate.harness.runner import decode_attention, decode_attention_by_block, pad

SMALL = ModelConfig(d_model=64, n_heads=2, n_layers=2, d_ff=128, max_seq_len=128, seed=3)
BLOCK = 4
CPU = torch.device("cpu")
# Scattered blocks, tables of different widths; every context ends inside a
# block (a partial last block), and the shorter rows are padded with block 0,
# which the third row really owns.
TABLES = [[9, 2], [14, 5, 0, 11, 7], [3, 12, 6]]
LENGTHS = [6, 17, 9]


def _slots(tables: list[list[int]], width: int) -> torch.Tensor:
    padded = torch.tensor([pad(table, width) for table in tables])
    return (padded.unsqueeze(-1) * BLOCK + torch.arange(BLOCK)).reshape(len(tables), -1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int8])
def test_gather_blocks_is_every_slot_of_the_blocks_in_order(dtype: torch.dtype) -> None:
    cache = KVCache(SMALL, num_blocks=16, block_size=BLOCK, device=CPU, dtype=dtype)
    cache.k.copy_(torch.randint(-100, 100, cache.k.shape))
    cache.v.copy_(torch.randint(-100, 100, cache.v.shape))
    for width in (2, 5, 3):  # the buffer grows, then is reused
        tables = [table[:width] for table in TABLES]
        blocks = torch.tensor([pad(table, width) for table in tables])
        slots = _slots(tables, width)
        k, v = cache.gather_blocks(1, blocks)
        assert k.shape == (3, width * BLOCK, SMALL.n_heads, SMALL.head_dim)
        assert k.dtype == dtype
        assert torch.equal(k, cache.k[1][slots])
        assert torch.equal(v, cache.v[1][slots])


def _prefilled(kv_dtype: torch.dtype, dtype: torch.dtype) -> tuple[TinyTransformer, KVCache]:
    """A model and a cache holding each row's context but its last token."""
    model = TinyTransformer(SMALL).to(dtype)
    cache = KVCache(
        SMALL, num_blocks=16, block_size=BLOCK, device=CPU, dtype=kv_dtype, compute_dtype=dtype
    )
    gen = torch.Generator().manual_seed(5)
    for table, length in zip(TABLES, LENGTHS, strict=True):
        n = length - 1
        slots = _slots([table], len(table))[0, :n]
        batch = AttentionBatch(
            is_prefill=True,
            slot_mapping=slots,
            context_slots=[slots],
            query_starts=[0, n],
            num_cached=[0],
        )
        tokens = torch.randint(0, 256, (n,), generator=gen)
        model.forward_paged(tokens, torch.arange(n), cache, batch, torch.tensor([n - 1]))
    return model, cache


@pytest.mark.parametrize(
    ("kv_dtype", "dtype"),
    [
        (torch.float32, torch.float32),
        (torch.bfloat16, torch.bfloat16),
        (torch.float16, torch.float16),
        (torch.int8, torch.float32),
        (torch.int8, torch.bfloat16),
    ],
)
@torch.no_grad()
def test_decode_by_block_gives_the_logits_of_decode_by_slot(
    kv_dtype: torch.dtype, dtype: torch.dtype
) -> None:
    model, cache = _prefilled(kv_dtype, dtype)
    lengths = torch.tensor(LENGTHS)
    tokens = torch.tensor([65, 66, 67])
    rows = torch.arange(len(TABLES))
    longest = max(LENGTHS)
    positions, by_slot = decode_attention(_slots(TABLES, 5)[:, :longest].contiguous(), lengths)
    expected = model.forward_paged(tokens, positions, copy.deepcopy(cache), by_slot, rows)
    width = -(-longest // BLOCK)
    blocks = torch.tensor([pad(table, width) for table in TABLES])
    by_block = decode_attention_by_block(blocks, positions, by_slot.slot_mapping, BLOCK)
    assert by_block.context_blocks is not None
    got = model.forward_paged(tokens, positions, cache, by_block, rows)
    # Only masked columns differ (the block padding), so the sums can differ
    # only in their rounding.
    torch.testing.assert_close(got, expected)
    assert torch.equal(got.argmax(-1), expected.argmax(-1))
