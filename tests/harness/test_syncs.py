"""Host syncs on the decode path: one wait for the device per decode step.

Counted through ``_sync.count_syncs`` (every device-to-host read goes through
``_sync.to_host``), and kept honest by a check of the decode path's source:
no ``.tolist()``, ``.item()``, ``bool(t.any())`` and the like anywhere else.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
import torch

from yieldgate.harness import _sync
from yieldgate.harness.engine import Engine, EngineConfig
from yieldgate.harness.sequence import SamplingParams
from yieldgate.harness.speculative import SpeculativeConfig

PROMPTS = [
    list(b"Hi"),
    list(b"The quick brown fox jumps over the lazy dog"),
    list(b"0123456789abcdef"),
    list(b"a longer prompt that spans several KV blocks of sixteen tokens each"),
]
GREEDY = SamplingParams(max_tokens=40)
SAMPLED = SamplingParams(max_tokens=40, temperature=0.8, top_p=0.9, seed=3, logprobs=3)
LOGPROBS = SamplingParams(max_tokens=40, logprobs=0)
QUICK = {"distill_steps": 10, "distill_sequences": 2, "distill_tokens": 8}
DECODE_STEPS = 8


def decode_reads(engine: Engine, params: list[SamplingParams]) -> tuple[int, int]:
    """Host reads and decode steps over ``DECODE_STEPS`` steps after the prefill."""
    for prompt, p in zip(PROMPTS, params, strict=True):
        engine.add(prompt, p)
    result = engine.step()
    assert result is not None
    assert result.is_prefill  # one prefill step takes every prompt
    steps = 0
    with _sync.count_syncs() as count:
        for _ in range(DECODE_STEPS):
            result = engine.step()
            assert result is not None
            assert not result.is_prefill
            steps += 1
    return count.reads, steps


@pytest.mark.parametrize(
    ("overrides", "params"),
    [
        ({}, [GREEDY] * 4),
        ({"dtype": "bfloat16"}, [GREEDY] * 4),
        ({"kv_dtype": "int8"}, [GREEDY] * 4),
        ({}, [SAMPLED, GREEDY, LOGPROBS, SAMPLED]),
        ({"speculative": SpeculativeConfig(k=4, **QUICK)}, [GREEDY] * 4),
        # Speculated rows beside sampled and logprob rows (those decode plainly).
        ({"speculative": SpeculativeConfig(k=3, **QUICK)}, [GREEDY, SAMPLED, LOGPROBS, GREEDY]),
    ],
    ids=["greedy", "bfloat16", "int8", "sampling-logprobs", "speculative", "speculative-mixed"],
)
def test_a_decode_step_waits_for_the_device_once(
    overrides: dict[str, Any], params: list[SamplingParams]
) -> None:
    engine = Engine(EngineConfig(**{"device": "cpu", "num_blocks": 64, **overrides}))
    reads, steps = decode_reads(engine, params)
    assert reads == steps == DECODE_STEPS


def test_branching_speculation_waits_once_a_step_too() -> None:
    # Which positions branch is chosen on the device, for a fixed number of
    # branch rows: the verify's shape does not wait for the drafts to be read.
    spec = SpeculativeConfig(k=3, branch_threshold=1.0, max_extra_tokens=2, **QUICK)
    engine = Engine(EngineConfig(device="cpu", num_blocks=64, speculative=spec))
    reads, steps = decode_reads(engine, [GREEDY] * 4)
    assert reads == steps == DECODE_STEPS


def test_the_counter_counts_reads_not_tensors() -> None:
    with _sync.count_syncs() as count:
        values = _sync.to_host(torch.tensor([1, 2]), torch.tensor(0.5))
        assert values == [[1, 2], 0.5]
        with _sync.count_syncs() as inner:
            _sync.to_host(torch.zeros(1))
        assert inner.reads == 1
    assert count.reads == 1  # the inner block counted its own


def test_to_device_makes_one_tensor_per_list() -> None:
    a, empty, b = _sync.to_device([[1, 2, 3], [], [7]], torch.device("cpu"))
    assert a.tolist() == [1, 2, 3]
    assert empty.numel() == 0
    assert b.tolist() == [7]
    assert a.dtype == torch.int64
    (f,) = _sync.to_device([[0.5]], torch.device("cpu"), torch.float32)
    assert f.dtype == torch.float32


# -- the decode path reads only through _sync --------------------------------------

HARNESS = Path(_sync.__file__).parent
DECODE_PATH = [
    "engine.py",
    "scheduler.py",
    "block_manager.py",
    "sequence.py",
    "runner.py",
    "model.py",
    "_kv_cache.py",
    "speculative.py",
    "kv_tiers.py",
]
# Off the decode path, or a wait of another kind, by (module, function).
ALLOWED = {
    ("model.py", "greedy_reference"),  # the test reference: a full forward per token
    ("engine.py", "read_kv"),  # a prefill worker's KV, sent to the decode worker
    # A page-in's event: queried without waiting; waited for only when the step
    # needs the blocks now (counted as the tier's ``kv_stall_ms``).
    ("kv_tiers.py", "is_done"),
    ("kv_tiers.py", "_wait"),
}
READS = {"tolist", "item", "cpu", "numpy", "synchronize"}


def _reads(tree: ast.AST) -> list[tuple[str, int]]:
    """Every direct device-to-host read in ``tree``, by enclosing function and line."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, function: str) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            function = node.name
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in READS:
                found.append((function, node.lineno))
            # bool(t.any()), int(t.max()), float(t.mean()): a tensor made a Python value.
            if (
                isinstance(func, ast.Name)
                and func.id in {"bool", "int", "float"}
                and any(
                    isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute)
                    for arg in node.args
                    for inner in ast.walk(arg)
                )
            ):
                found.append((function, node.lineno))
        # ``if t.any():``: the same read, implicit.
        if isinstance(node, ast.If | ast.While | ast.IfExp | ast.Assert):
            test = node.test
            if (
                isinstance(test, ast.Call)
                and isinstance(test.func, ast.Attribute)
                and test.func.attr in {"any", "all"}
            ):
                found.append((function, node.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(tree, "<module>")
    return found


@pytest.mark.parametrize("module", DECODE_PATH)
def test_the_decode_path_reads_from_the_device_only_through_to_host(module: str) -> None:
    tree = ast.parse((HARNESS / module).read_text(encoding="utf-8"))
    direct = [
        (function, line) for function, line in _reads(tree) if (module, function) not in ALLOWED
    ]
    assert direct == [], f"{module}: read the device through _sync.to_host"


def test_the_check_finds_the_reads_it_forbids() -> None:
    source = """
def step(t, u):
    a = t.tolist()
    if bool(u.any()):
        pass
    b = int(t.max())
    if u.any():
        pass
    return a, b, t.item(), bool(flag)
"""
    assert [line for _, line in _reads(ast.parse(source))] == [3, 4, 6, 7, 9]
