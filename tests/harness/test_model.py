from __future__ import annotations

from pathlib import Path

import pytest
import torch

from yieldgate.harness.engine import pick_device
from yieldgate.harness.model import (
    AttentionBatch,
    KVCache,
    ModelConfig,
    TinyTransformer,
    load_checkpoint,
    save_checkpoint,
)

SMALL = ModelConfig(d_model=64, n_heads=2, n_layers=2, d_ff=128, max_seq_len=128, seed=3)


def test_weights_come_from_the_seed() -> None:
    a, b = TinyTransformer(SMALL), TinyTransformer(SMALL)
    c = TinyTransformer(ModelConfig(**{**_fields(SMALL), "seed": 4}))
    for (name, pa), (_, pb), (_, pc) in zip(
        a.state_dict().items(), b.state_dict().items(), c.state_dict().items(), strict=True
    ):
        assert torch.equal(pa, pb), name
        if "weight" in name and "ln" not in name:
            assert not torch.equal(pa, pc), name


def _fields(config: ModelConfig) -> dict[str, int]:
    return {name: getattr(config, name) for name in config.__dataclass_fields__}


def test_paged_prefill_gives_the_full_forward_logits() -> None:
    model = TinyTransformer(SMALL)
    tokens = torch.tensor(list(b"paged attention over blocks"))
    full = model.forward_full(tokens)
    block_size = 4
    cache = KVCache(SMALL, num_blocks=16, block_size=block_size, device=torch.device("cpu"))
    # The sequence's blocks are scattered: 9, 2, 14, ... (not in order).
    table = [9, 2, 14, 5, 0, 11, 7]
    slots = torch.tensor([table[p // block_size] * block_size + p % block_size for p in range(27)])
    first = 10
    # Step 1: the first 10 tokens, nothing cached.
    batch = AttentionBatch(
        is_prefill=True,
        slot_mapping=slots[:first],
        context_slots=[slots[:first]],
        query_starts=[0, first],
        num_cached=[0],
    )
    out = model.forward_paged(
        tokens[:first], torch.arange(first), cache, batch, torch.tensor([first - 1])
    )
    torch.testing.assert_close(out[0], full[first - 1], rtol=1e-4, atol=1e-4)
    # Step 2: the rest, attending over the 10 cached ones too.
    batch = AttentionBatch(
        is_prefill=True,
        slot_mapping=slots[first:],
        context_slots=[slots],
        query_starts=[0, 27 - first],
        num_cached=[first],
    )
    out = model.forward_paged(
        tokens[first:], torch.arange(first, 27), cache, batch, torch.tensor([27 - first - 1])
    )
    torch.testing.assert_close(out[0], full[-1], rtol=1e-4, atol=1e-4)


def test_forward_full_refuses_sequences_past_its_positions() -> None:
    model = TinyTransformer(SMALL)
    with pytest.raises(ValueError, match="max_seq_len"):
        model.forward_full(torch.zeros(SMALL.max_seq_len + 1, dtype=torch.long))


def test_checkpoint_round_trip(tmp_path: Path) -> None:
    model = TinyTransformer(SMALL)
    path = tmp_path / "tiny.pt"
    save_checkpoint(model, path)
    loaded = load_checkpoint(path)
    assert loaded.config == SMALL
    prompt = list(b"checkpoint")
    assert loaded.greedy_reference(prompt, 8) == model.greedy_reference(prompt, 8)


def test_bad_checkpoints_are_value_errors(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="cannot load checkpoint"):
        load_checkpoint(garbage)
    other = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(2)}, other)
    with pytest.raises(ValueError, match="not a yieldgate harness checkpoint"):
        load_checkpoint(other)
    mismatched = tmp_path / "mismatched.pt"
    model = TinyTransformer(SMALL)
    config = {**_fields(SMALL), "d_ff": 256}
    torch.save({"config": config, "state_dict": model.state_dict()}, mismatched)
    with pytest.raises(ValueError, match="do not fit"):
        load_checkpoint(mismatched)
    with pytest.raises(ValueError, match="cannot load checkpoint"):
        load_checkpoint(tmp_path / "missing.pt")


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="multiple of n_heads"):
        ModelConfig(d_model=65, n_heads=2)
    with pytest.raises(ValueError, match="n_layers"):
        ModelConfig(n_layers=0)


def test_pick_device() -> None:
    assert pick_device("cpu").type == "cpu"
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert pick_device("auto").type == expected
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            pick_device("cuda")
