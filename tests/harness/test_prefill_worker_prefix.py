"""A prefill worker's own prefix tier: a prefix its small pool evicted is copied back, not computed.

Issue 42: a prefill worker kept only the prefix cache of its pool (two
batches' worth), so a shared prefix evicted by other prompts was computed
again. The worker here runs in this process, its control connection and
gloo group replaced by fakes that acknowledge every transfer.
"""

from __future__ import annotations

from dataclasses import asdict

import pytest
import torch

from yieldgate.harness.backend import HarnessConfig
from yieldgate.harness.engine import Engine, EngineConfig
from yieldgate.harness.model import ModelConfig
from yieldgate.harness.prefill_worker import WorkerSpec, _Job, _Worker
from yieldgate.harness.transfer import decode_message, encode_message

SMALL = ModelConfig(d_model=32, n_layers=1, n_heads=2, d_ff=64)
BLOCK = 4
PREFIX = [(i * 37 + 5) % 256 for i in range(4 * BLOCK)]  # four full blocks, shared
FIRST = [*PREFIX, 1, 2, 3, 4, 5]
OTHER = [(i * 11 + 200) % 256 for i in range(8 * BLOCK + 1)]  # fills the worker's 8 blocks
SECOND = [*PREFIX, 9, 8, 7, 6, 5, 4]


class FakeConn:
    """The control connection: records the worker's messages, acknowledges each ``kv``."""

    def __init__(self) -> None:
        self.sent: list[dict[str, object]] = []
        self._inbox: list[bytes] = []

    def send_bytes(self, raw: bytes) -> None:
        message = decode_message(raw)
        self.sent.append(message)
        if message["op"] == "kv":
            self._inbox.append(encode_message({"op": "ack", "id": message["id"], "ok": True}))

    def recv_bytes(self) -> bytes:
        return self._inbox.pop(0)

    def poll(self) -> bool:
        return bool(self._inbox)


class _Done:
    def wait(self) -> None:
        return None


class FakeGroup:
    """The gloo group: keeps each KV tensor sent, by request, in order."""

    def __init__(self) -> None:
        self.kv: list[torch.Tensor] = []

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> _Done:
        self.kv.append(tensors[0].clone())
        return _Done()


def make_worker(host_prefix_blocks: int) -> tuple[_Worker, FakeGroup]:
    spec = WorkerSpec(
        model=asdict(SMALL),
        checkpoint=None,
        device="cpu",
        num_blocks=8,
        block_size=BLOCK,
        max_batch_tokens=64,
        torch_threads=1,
        timeout_s=10.0,
        host_prefix_blocks=host_prefix_blocks,
    )
    torch.manual_seed(0)  # the same weights for every worker here
    group = FakeGroup()
    worker = _Worker(Engine(spec.engine_config()), group, FakeConn(), spec)  # type: ignore[arg-type]
    return worker, group


def prefill(worker: _Worker, request_id: int, prompt: list[int]) -> int:
    """Prefill one job alone; the prompt tokens the worker computed for it."""
    before = worker.prompt_tokens_computed
    worker.jobs.append(_Job(request_id, prompt, 0))
    worker._prefill_batch()
    assert not worker.jobs
    return worker.prompt_tokens_computed - before


@pytest.mark.parametrize("host_prefix_blocks", [0, 32])
def test_a_prefix_evicted_from_the_workers_pool_is_paged_back_from_its_tier(
    host_prefix_blocks: int,
) -> None:
    worker, _ = make_worker(host_prefix_blocks)
    blocks = worker.engine.blocks
    assert prefill(worker, 0, FIRST) == len(FIRST) - 1  # the decode worker computes the last
    assert blocks.cached_prefix(SECOND) == len(PREFIX)  # in the pool, for now
    prefill(worker, 1, OTHER)
    assert blocks.cached_prefix(SECOND) == 0  # evicted by the other prompt
    computed = prefill(worker, 2, SECOND)
    if host_prefix_blocks:
        # The four shared blocks came back from the worker's tier: only the rest is computed.
        assert computed == len(SECOND) - 1 - len(PREFIX)
        assert worker.prefix_hit_tokens == len(PREFIX)
        pager = worker.engine.prefix_pager
        assert pager is not None
        stats = pager.tier.stats()
        assert stats.blocks_paged_back == len(PREFIX) // BLOCK
        assert stats.pinned == 0
    else:
        assert computed == len(SECOND) - 1  # before: computed again, all of it
        assert worker.prefix_hit_tokens == 0
    assert blocks.stats().num_used == 0
    assert [m["id"] for m in worker.conn.sent if m["op"] == "kv"] == [0, 1, 2]  # type: ignore[attr-defined]


def test_the_paged_back_prefix_gives_the_kv_of_computing_it_all() -> None:
    with_tier, group = make_worker(32)
    without, reference = make_worker(0)
    for worker in (with_tier, without):
        prefill(worker, 0, FIRST)
        prefill(worker, 1, OTHER)
        prefill(worker, 2, SECOND)
    assert with_tier.prefix_hit_tokens == len(PREFIX)
    assert without.prefix_hit_tokens == 0
    # Same weights, same prompts: the KV sent for SECOND matches, the paged-back part bit for bit.
    sent, expected = group.kv[2], reference.kv[2]
    assert sent.shape == expected.shape
    assert torch.equal(sent[:, :, : len(PREFIX)], expected[:, :, : len(PREFIX)])
    torch.testing.assert_close(sent, expected, rtol=0, atol=1e-5)


def test_the_workers_spec_carries_the_engines_prefix_tier() -> None:
    config = HarnessConfig(engine=EngineConfig(device="cpu", num_blocks=256, host_prefix_blocks=48))
    assert config.worker_spec(512).host_prefix_blocks == 48
    spec = HarnessConfig(engine=EngineConfig(device="cpu", num_blocks=256)).worker_spec(512)
    assert spec.host_prefix_blocks == 0
