"""int8 decode attention (issue 42): one conversion into kept buffers, the same bits.

A decode step's int8 blocks are gathered (a quarter of float32's bytes), then
transposed and converted in one copy into a buffer the cache keeps
(``KVCache.converted``: the keys, then the values), and each block's scales are applied to its run
of scores and probabilities. The path before it (two fresh copies, scales
expanded to every slot) stays behind ``model.INT8_BEFORE_ISSUE_42``: the new
one computes the same arithmetic, so it must give the same bits.
"""

from __future__ import annotations

import copy

import pytest
import torch

import yieldgate.harness.model as model_module
from yieldgate.harness.model import AttentionBatch, KVCache, ModelConfig, TinyTransformer
from yieldgate.harness.runner import decode_attention, decode_attention_by_block, pad

SMALL = ModelConfig(d_model=64, n_heads=2, n_layers=2, d_ff=128, max_seq_len=128, seed=3)
BLOCK = 4
CPU = torch.device("cpu")
TABLES = [[9, 2], [14, 5, 0, 11, 7], [3, 12, 6]]
LENGTHS = [6, 17, 9]


def _slots(tables: list[list[int]], width: int) -> torch.Tensor:
    padded = torch.tensor([pad(table, width) for table in tables])
    return (padded.unsqueeze(-1) * BLOCK + torch.arange(BLOCK)).reshape(len(tables), -1)


def _cache(dtype: torch.dtype) -> KVCache:
    return KVCache(
        SMALL, num_blocks=16, block_size=BLOCK, device=CPU, dtype=torch.int8, compute_dtype=dtype
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_converted_is_the_gathered_int8_values_heads_first(dtype: torch.dtype) -> None:
    cache = _cache(dtype)
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(16 * BLOCK, SMALL.n_heads, SMALL.head_dim, generator=gen) * 3
    cache.write(1, torch.arange(16 * BLOCK), x, -2 * x)
    for width in (2, 5, 3):  # the buffers grow, then are reused
        tables = [table[:width] for table in TABLES]
        blocks = torch.tensor([pad(table, width) for table in tables])
        k8, v8 = cache.gather_blocks(1, blocks)
        slots = _slots(tables, width)
        for gathered, store in ((k8, cache.k), (v8, cache.v)):
            got = cache.converted(gathered)
            assert got.shape == (3, SMALL.n_heads, width * BLOCK, SMALL.head_dim)
            assert got.dtype == dtype
            assert got.is_contiguous()
            assert torch.equal(got, store[1][slots].transpose(1, 2).to(dtype))


def _prefilled(dtype: torch.dtype) -> tuple[TinyTransformer, KVCache]:
    model = TinyTransformer(SMALL).to(dtype)
    cache = _cache(dtype)
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


def _decode(
    model: TinyTransformer, cache: KVCache, monkeypatch: pytest.MonkeyPatch, *, old: bool
) -> torch.Tensor:
    monkeypatch.setattr(model_module, "INT8_BEFORE_ISSUE_42", old)
    positions, by_slot = decode_attention(
        _slots(TABLES, 5)[:, : max(LENGTHS)].contiguous(), torch.tensor(LENGTHS)
    )
    width = -(-max(LENGTHS) // BLOCK)
    blocks = torch.tensor([pad(table, width) for table in TABLES])
    batch = decode_attention_by_block(blocks, positions, by_slot.slot_mapping, BLOCK)
    rows = torch.arange(len(TABLES))
    tokens = torch.tensor([65, 66, 67])
    return model.forward_paged(tokens, positions, copy.deepcopy(cache), batch, rows).float()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@torch.no_grad()
def test_int8_decode_gives_the_bits_of_the_path_before_issue_42(
    dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, cache = _prefilled(dtype)
    new = _decode(model, cache, monkeypatch, old=False)
    old = _decode(model, cache, monkeypatch, old=True)
    assert torch.equal(new, old)


@torch.no_grad()
def test_int8_decode_in_float32_is_close_to_the_dequantised_cache_read_in_float64(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The scales applied to scores and probabilities are the scales applied to the
    # keys and values: float64 attention over ``KVCache.read``'s values agrees.
    model, cache = _prefilled(torch.float32)
    got = _decode(model, cache, monkeypatch, old=False)
    wide = _cache(torch.float64)
    wide.k.copy_(cache.k)
    wide.v.copy_(cache.v)
    wide.kv_scale.copy_(cache.kv_scale)
    reference = _decode(model.double(), wide, monkeypatch, old=True)
    torch.testing.assert_close(got, reference.float(), rtol=1e-5, atol=1e-5)
