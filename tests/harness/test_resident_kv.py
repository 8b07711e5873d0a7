"""Resident decode rows (issue 42): decode reads each running context in place, no gather.

Every engine here runs twice, with ``resident_kv`` on and off, and must give
the same tokens and the same log-probabilities to the bit: the resident rows
hold exactly what the paged cache holds, whatever moved, was preempted,
paged out and in, or arrived between steps.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from yieldgate.harness import Engine, EngineConfig, SamplingParams
from yieldgate.harness._resident import ResidentKV, _move_rows
from yieldgate.harness.model import KVCache, ModelConfig
from yieldgate.harness.sequence import Sequence

SMALL = ModelConfig(d_model=64, n_heads=2, n_layers=2, d_ff=128, max_seq_len=256, seed=7)
LOGPROBS = SamplingParams(max_tokens=40, logprobs=3)


def engine(resident: bool, **overrides: Any) -> Engine:
    config: dict[str, Any] = {"device": "cpu", "model": SMALL, "num_blocks": 128, **overrides}
    return Engine(EngineConfig(resident_kv=resident, **config))


def prompts(n: int, shortest: int = 3, step: int = 5) -> list[list[int]]:
    return [list(f"{i:02d} {'abcdefgh' * 20}".encode()[: shortest + step * i]) for i in range(n)]


def run(
    eng: Engine, work: list[tuple[list[int], SamplingParams]], *, arrive_every: int = 0
) -> list[tuple[list[int], list[Any]]]:
    """Run ``work`` to the end, adding one request every ``arrive_every`` steps (0: all first)."""
    pending = list(work)
    seqs: list[Sequence] = []
    steps = 0
    while pending or not all(seq.is_finished for seq in seqs):
        if pending and (arrive_every == 0 or steps % arrive_every == 0):
            for prompt, params in pending if arrive_every == 0 else pending[:1]:
                seqs.append(eng.add(prompt, params))
            pending = [] if arrive_every == 0 else pending[1:]
        assert eng.step() is not None or pending
        steps += 1
    return [(seq.output, list(seq.logprobs)) for seq in seqs]


def both(work: list[tuple[list[int], SamplingParams]], **kw: Any) -> tuple[Any, Any, Engine]:
    arrive = kw.pop("arrive_every", 0)
    on = engine(True, **kw)
    got = run(on, work, arrive_every=arrive)
    want = run(engine(False, **kw), work, arrive_every=arrive)
    return got, want, on


@pytest.mark.parametrize(
    ("dtype", "kv_dtype"), [("float32", "auto"), ("bfloat16", "auto"), ("float32", "bfloat16")]
)
def test_rows_that_finish_at_different_steps_give_the_gathered_logprobs(
    dtype: str, kv_dtype: str
) -> None:
    # Outputs of 10 to 73 tokens: as each sequence finishes, the rows after it move up.
    work = [
        (p, SamplingParams(max_tokens=10 + 7 * i, logprobs=3)) for i, p in enumerate(prompts(10))
    ]
    got, want, on = both(work, dtype=dtype, kv_dtype=kv_dtype)
    assert got == want
    resident = on.cache.resident
    assert resident is not None
    assert resident.rows_moved > 0
    # Built once per sequence (its first decode step), then kept: far fewer than the
    # row-steps a gather copies every step.
    assert resident.rows_built == len(work)


def test_requests_arriving_between_steps_keep_the_running_rows() -> None:
    work = [(p, LOGPROBS) for p in prompts(8)]
    got, want, on = both(work, arrive_every=3)
    assert got == want
    assert on.cache.resident is not None
    # Each prefill writes only its own sequence's blocks: the running rows stay.
    assert on.cache.resident.rows_built == len(work)


def test_sampled_sequences_give_the_same_draws() -> None:
    work = [
        (p, SamplingParams(max_tokens=30, temperature=0.9, seed=i))
        for i, p in enumerate(prompts(6))
    ]
    got, want, _ = both(work)
    assert got == want


def test_preempted_and_recomputed_sequences_are_rebuilt_from_the_cache() -> None:
    # 10 blocks of 16 tokens for 6 sequences growing to about 80: some are preempted
    # and recomputed, into the same blocks or others.
    work = [(p, SamplingParams(max_tokens=60, logprobs=2)) for p in prompts(6, 10, 3)]
    got, want, on = both(work, num_blocks=10)
    assert got == want
    assert on.stats()["preemptions"] > 0


def test_sequences_paged_out_and_in_are_rebuilt_or_kept_exactly() -> None:
    # Greedy tokens, not log-probabilities: which step a paged-in sequence rejoins
    # depends on when the copy thread finishes, so the batches (and the last bits of
    # their sums) differ from run to run, with or without resident rows.
    work = [(p, SamplingParams(max_tokens=60)) for p in prompts(6, 10, 3)]
    got, want, on = both(work, num_blocks=10, host_kv_blocks=64)
    assert [out for out, _ in got] == [out for out, _ in want]
    stats = on.stats()
    assert stats["kv_swap_outs"] > 0
    assert stats["preemptions"] == 0


def test_speculative_decoding_is_unchanged() -> None:
    from yieldgate.harness import SpeculativeConfig

    work = [(p, SamplingParams(max_tokens=30)) for p in prompts(5)]
    got, want, _ = both(work, speculative=SpeculativeConfig())
    assert [out for out, _ in got] == [out for out, _ in want]


def test_the_default_is_on_for_a_float_cache_on_a_cpu_and_off_for_int8() -> None:
    assert Engine(EngineConfig(device="cpu", model=SMALL)).cache.resident is not None
    int8 = Engine(EngineConfig(device="cpu", model=SMALL, kv_dtype="int8"))
    assert int8.cache.resident is None
    with pytest.raises(ValueError, match="resident_kv needs a float kv_dtype"):
        EngineConfig(resident_kv=True, kv_dtype="int8")
    with pytest.raises(ValueError, match="float KV cache"):
        KVCache(SMALL, num_blocks=4, block_size=4, device=torch.device("cpu"),
                dtype=torch.int8).use_resident()  # fmt: skip


# -- the rows themselves ------------------------------------------------------


def _cache(resident: ResidentKV | None = None) -> KVCache:
    cache = KVCache(SMALL, num_blocks=8, block_size=4, device=torch.device("cpu"))
    cache.k.copy_(torch.randn(cache.k.shape))
    cache.v.copy_(torch.randn(cache.v.shape))
    cache.use_resident(rows=2)
    if resident is not None:
        cache.resident = resident
    return cache


def _slots(table: list[int]) -> list[int]:
    return [b * 4 + i for b in table for i in range(4)]


def _decode(
    cache: KVCache, tables: list[list[int]], positions: list[int], ids: list[int], *,
    commit: bool = True,
) -> Any:  # fmt: skip
    """One decode step as the model makes it: the rows readied, each row's new key and
    value (random) written to the cache and through the step, then committed."""
    resident = cache.resident
    assert resident is not None
    width = max(positions) // 4 + 1
    padded = torch.tensor([(t + [0] * width)[:width] for t in tables])
    columns = torch.arange(width * 4)
    mask = (columns <= torch.tensor(positions).unsqueeze(1)).view(len(ids), 1, 1, -1)
    step = resident.step(cache.blocked, ids, tables, positions, padded, mask)
    slots = torch.tensor([_slots(t)[p] for t, p in zip(tables, positions, strict=True)])
    for layer in range(SMALL.n_layers):
        kv = torch.randn(len(ids), 2, SMALL.n_heads, SMALL.head_dim)
        cache.k[layer].index_copy_(0, slots, kv[:, 0])
        cache.v[layer].index_copy_(0, slots, kv[:, 1])
        step.write(layer, kv)
    if commit:
        resident.commit()
    return step


def _holds(cache: KVCache, step: Any, tables: list[list[int]], positions: list[int]) -> bool:
    """Whether each row holds its context up to and with its new token, as the cache does."""
    for layer in range(SMALL.n_layers):
        k, v = step.keys_values(layer)  # (rows, H, L, D)
        for row, (table, at) in enumerate(zip(tables, positions, strict=True)):
            slots = _slots(table)[: at + 1]
            if not torch.equal(k[row, :, : at + 1], cache.k[layer, slots].transpose(0, 1)):
                return False
            if not torch.equal(v[row, :, : at + 1], cache.v[layer, slots].transpose(0, 1)):
                return False
    return True


def test_a_row_is_built_once_kept_and_rebuilt_when_its_blocks_are_written() -> None:
    cache = _cache()
    resident = cache.resident
    assert resident is not None
    tables, ids = [[3, 5], [6]], [10, 11]
    step = _decode(cache, tables, [5, 2], ids)
    assert resident.rows_built == 2
    assert _holds(cache, step, tables, [5, 2])
    step = _decode(cache, tables, [6, 3], ids)  # the next token of each: nothing built
    assert resident.rows_built == 2
    assert _holds(cache, step, tables, [6, 3])
    # Something else writes block 5 (a page-in, KV from a worker): row 0 is rebuilt.
    cache.k[0, 5 * 4] += 1.0
    cache.written(torch.tensor([5 * 4]))
    step = _decode(cache, [[3, 5], [6, 1]], [7, 4], ids)
    assert resident.rows_built == 3
    assert _holds(cache, step, [[3, 5], [6, 1]], [7, 4])


def test_a_step_not_committed_leaves_no_row_held() -> None:
    cache = _cache()
    assert cache.resident is not None
    _decode(cache, [[1]], [2], [1], commit=False)  # the model failed midway
    step = _decode(cache, [[1]], [3], [1])
    assert cache.resident.rows_built == 2
    assert _holds(cache, step, [[1]], [3])


def test_rows_that_change_places_move_and_a_new_table_is_rebuilt() -> None:
    cache = _cache()
    resident = cache.resident
    assert resident is not None
    _decode(cache, [[1, 2], [4]], [5, 1], [1, 2])
    # The two rows swap places: moved, not built.
    step = _decode(cache, [[4], [1, 2]], [2, 6], [2, 1])
    assert (resident.rows_built, resident.rows_moved) == (2, 2)
    assert _holds(cache, step, [[4], [1, 2]], [2, 6])
    # Sequence 2 is back in another block (paged in elsewhere): built again.
    cache.k[:, 7 * 4 : 8 * 4] = cache.k[:, 4 * 4 : 5 * 4]
    cache.v[:, 7 * 4 : 8 * 4] = cache.v[:, 4 * 4 : 5 * 4]
    step = _decode(cache, [[7], [1, 2]], [3, 7], [2, 1])
    assert (resident.rows_built, resident.rows_moved) == (3, 2)
    assert _holds(cache, step, [[7], [1, 2]], [3, 7])


def test_rows_grow_past_the_columns_made_at_first_keeping_what_they_hold() -> None:
    small = ResidentKV(n_layers=2, n_heads=2, head_dim=32, block_size=4, dtype=torch.float32,
                       device=torch.device("cpu"), rows=1, columns=4)  # fmt: skip
    cache = _cache(small)
    table = [0, 1, 2, 3, 4, 5, 6, 7]
    for at in range(30):
        step = _decode(cache, [table[: at // 4 + 1]], [at], [1])
        assert _holds(cache, step, [table[: at // 4 + 1]], [at])
    assert small.rows_built == 1
    assert small.store is not None
    assert small.store.shape[4] == 32  # 4, 8, 16, 32: doubled


@pytest.mark.parametrize(("flag", "wanted"), [("auto", None), ("on", True), ("off", False)])
def test_the_serve_flag_sets_it_and_names_itself_in_errors(flag: str, wanted: bool | None) -> None:
    from yieldgate.cli import _parser
    from yieldgate.cli._common import flag_error
    from yieldgate.cli._serve import _harness_backend
    from yieldgate.cli._serve_flags import FLAGS

    args = _parser().parse_args(["serve", "--backend", "harness", "--resident-kv", flag])
    assert _harness_backend(args).config.engine.resident_kv is wanted
    with pytest.raises(ValueError, match="resident_kv needs a float kv_dtype") as caught:
        EngineConfig(resident_kv=True, kv_dtype="int8")
    assert str(flag_error(caught.value, FLAGS)).startswith("--resident-kv")


def test_the_counters_show_the_rows_memory_and_work() -> None:
    on = engine(True, num_blocks=512)
    run(on, [(p, SamplingParams(max_tokens=5)) for p in prompts(3)])
    stats = on.stats()
    assert stats["kv_resident_rows_built"] == 3
    # Made for max_num_seqs rows of 256 tokens: keys and values of every layer, float32.
    rows = EngineConfig().scheduler.max_num_seqs
    assert stats["kv_resident_bytes"] == rows * SMALL.n_layers * 2 * 256 * SMALL.d_model * 4
    assert stats["kv_resident_steps_gathered"] == 0
    off = engine(False)
    run(off, [(p, SamplingParams(max_tokens=5)) for p in prompts(3)])
    assert off.stats()["kv_resident_bytes"] == off.stats()["kv_resident_rows_built"] == 0


def test_the_rows_never_take_more_memory_than_the_cache_and_gather_past_it() -> None:
    # 10 blocks of 16 slots: six sequences of up to 80 tokens would need 6 x 80 row
    # slots, more than the cache's 160; those steps gather, with the same outputs.
    work = [(p, SamplingParams(max_tokens=60, logprobs=2)) for p in prompts(6, 10, 3)]
    got, want, on = both(work, num_blocks=10)
    assert got == want
    stats = on.stats()
    assert stats["kv_resident_steps_gathered"] > 0
    cache_bytes = on.cache.k.numel() * on.cache.k.element_size() * 2
    assert 0 < stats["kv_resident_bytes"] <= cache_bytes


@pytest.mark.parametrize("value", ["yes", 1, 0.0])
def test_a_resident_kv_that_is_not_a_bool_is_refused(value: Any) -> None:
    with pytest.raises(ValueError, match="resident_kv must be None, True or False"):
        EngineConfig(resident_kv=value, kv_dtype="int8")


@pytest.mark.parametrize(
    "moved",
    [
        [(0, 1), (1, 2), (2, 4)],  # a finished sequence's rows closing up
        [(0, 2), (2, 0)],  # a swap
        [(1, 0), (2, 1), (3, 2)],  # a newcomer ahead of them pushes them down
        [(0, 3), (3, 1), (1, 0)],  # a cycle
    ],
)
def test_rows_move_exactly_within_the_columns_read(moved: list[tuple[int, int]]) -> None:
    store = torch.arange(2 * 5 * 2 * 3 * 8 * 4, dtype=torch.float32).view(2, 5, 2, 3, 8, 4)
    before = store.clone()
    _move_rows(store, moved, 6)
    expected = before.clone()
    for r, s in moved:
        expected[:, r, :, :, :6] = before[:, s, :, :, :6]
    assert torch.equal(store, expected)  # the spare columns untouched too
