"""A prefill worker process: computes prompts' KV and sends it to the decode worker.

Started by ``PrefillPool`` as ``python -m yieldgate.harness._worker_main``
with a JSON launch record on stdin (nothing pickled). It connects back to
the decode worker's control listener (authenticated by a one-time key), joins
the gloo group, loads the same model as the decode worker (same seed or
checkpoint), keeps a prefix cache of its own, and serves ``prefill`` jobs
from its control connection:

1. compute the KV of the prompt's tokens except the last (the decode worker
   computes that one, whose logits give the first new token);
2. send a ``kv`` header (request id, positions, dtype, shape, checksum) on
   the pipe, then the KV on the gloo group to rank 0;
3. keep the KV until the decode worker acknowledges it: an ``ack`` with
   ``ok: false`` (checksum mismatch) makes it send again, up to
   ``_MAX_SENDS`` times, then report ``failed``.

Jobs that arrive while one is computed or sent wait in order and are
prefilled together in the next batch.

Its KV pool is sized to what it prefills, not to the decode worker's pool
(``prefill_worker_blocks``): it only holds the batch it computes until the
KV is sent, and its prefix cache. With ``host_prefix_blocks`` (the decode
worker's ``--host-prefix-blocks``) it keeps a prefix tier of its own, as the
decode engine does: cached blocks its small pool evicts are copied to host
memory, and a later prompt with the same prefix has them copied back
(waiting for the copy: the worker computes the rest at once) instead of
computing them again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import time
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Client, Connection
from pathlib import Path
from typing import Any

import torch

from yieldgate.harness.engine import Engine, EngineConfig
from yieldgate.harness.model import ModelConfig
from yieldgate.harness.scheduler import Batch
from yieldgate.harness.sequence import SamplingParams, Sequence
from yieldgate.harness.transfer import (
    KvHeader,
    TransferError,
    connect_group,
    decode_message,
    encode_message,
    tcp_store,
)

__all__ = ["WorkerSpec", "prefill_worker_blocks", "run_worker"]

log = logging.getLogger("yieldgate.harness.prefill")

_MAX_SENDS = 3
_KV_TAG = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerSpec:
    """Everything a prefill worker needs, as plain values (it crosses a process spawn).

    ``num_blocks`` is the worker's own KV pool (``prefill_worker_blocks``),
    not the decode worker's.
    """

    model: dict[str, int]  # ModelConfig fields
    checkpoint: str | None
    device: str
    num_blocks: int
    block_size: int
    max_batch_tokens: int
    torch_threads: int
    timeout_s: float
    corrupt_first: int = 0  # testing only: send this many corrupted transfers first
    dtype: str = "float32"  # the decode engine's model dtype: the KV is sent in it
    # The worker's own prefix tier (``EngineConfig.host_prefix_blocks``); 0 drops evicted blocks.
    host_prefix_blocks: int = 0

    def engine_config(self) -> EngineConfig:
        return EngineConfig(
            model=ModelConfig(**self.model),
            checkpoint=Path(self.checkpoint) if self.checkpoint else None,
            device=self.device,
            num_blocks=self.num_blocks,
            block_size=self.block_size,
            dtype=self.dtype,
            host_prefix_blocks=self.host_prefix_blocks,
        )

    def holds(self, num_prompt: int) -> bool:
        """Whether the worker's pool holds the KV it computes for a prompt of ``num_prompt``."""
        context = num_prompt - 1  # the decode worker computes the last token
        return -(-context // self.block_size) <= self.num_blocks


def prefill_worker_blocks(max_prompt_tokens: int, block_size: int, decode_blocks: int) -> int:
    """The KV blocks a prefill worker allocates: one batch, and as many again for its prefix cache.

    A worker holds a batch's KV only until it is sent. Its longest job is the
    decode worker's longest prompt (``Engine.max_prompt_tokens``) less the
    last token, which the decode worker computes; a batch's new tokens are
    bounded by ``max_num_batched_tokens`` like a prompt's, so the longest
    prompt fills a batch alone. Shorter prompts whose blocks, rounded up, do
    not fit together wait for the next batch. As many blocks again keep
    earlier prompts' blocks in its prefix cache while a batch is computed.
    Never more than the decode worker's pool (``decode_blocks``).
    """
    if min(max_prompt_tokens, block_size, decode_blocks) < 1:
        raise ValueError("max_prompt_tokens, block_size and decode_blocks must be >= 1")
    batch = -(-max(1, max_prompt_tokens - 1) // block_size)
    return min(decode_blocks, 2 * batch)


@dataclass(slots=True)
class _Job:
    request_id: int
    tokens: list[int]
    start: int


def run_worker(
    rank: int, world_size: int, store_port: int, conn: Connection, spec: WorkerSpec
) -> None:
    """Serve prefill jobs on ``conn`` until told to stop or the decode worker goes."""
    torch.set_num_threads(spec.torch_threads)
    store = tcp_store(store_port, world_size, is_master=False, timeout_s=spec.timeout_s)
    engine = Engine(spec.engine_config())
    group = connect_group(store, rank, world_size, spec.timeout_s)
    worker = _Worker(engine, group, conn, spec)
    ready = {"op": "ready", "rank": rank, "kv_blocks": engine.blocks.num_blocks}
    conn.send_bytes(encode_message(ready))
    with contextlib.suppress(EOFError, OSError):  # the decode worker went away
        worker.serve()


def main() -> int:
    """A prefill worker process's main function: the launch record comes on stdin."""
    logging.basicConfig(level=logging.WARNING, format="prefill worker: %(message)s")
    launch = json.loads(sys.stdin.read())
    host, port = launch["control"]
    conn = Client((host, port), authkey=bytes.fromhex(launch["authkey"]))
    conn.send_bytes(encode_message({"op": "hello", "rank": launch["rank"]}))
    spec = WorkerSpec(**launch["spec"])
    run_worker(launch["rank"], launch["world_size"], launch["store_port"], conn, spec)
    return 0


class _Worker:
    def __init__(self, engine: Engine, group: Any, conn: Connection, spec: WorkerSpec) -> None:
        self.engine = engine
        self.group = group
        self.conn = conn
        self.spec = spec
        self.jobs: deque[_Job] = deque()
        self.acks: dict[int, bool] = {}
        self.stopping = False
        self.corrupt_left = spec.corrupt_first
        # Prompt tokens computed here, and those found in its prefix cache or tier.
        self.prompt_tokens_computed = 0
        self.prefix_hit_tokens = 0
        cfg = engine.model.config
        self.expect = (cfg.n_layers, cfg.n_heads, cfg.head_dim)

    def serve(self) -> None:
        while not self.stopping:
            if not self.jobs:
                self._handle(self.conn.recv_bytes())
            while self.conn.poll():
                self._handle(self.conn.recv_bytes())
            if self.jobs and not self.stopping:
                self._prefill_batch()

    def _handle(self, raw: bytes) -> None:
        try:
            message = decode_message(raw)
        except TransferError as exc:
            log.warning("ignoring a bad control message: %s", exc)
            return
        op = message["op"]
        if op == "prefill":
            tokens, start = message.get("tokens"), message.get("start")
            request_id = message.get("id")
            if (
                type(request_id) is not int
                or type(start) is not int
                or not isinstance(tokens, list)
                or not all(type(t) is int and 0 <= t < 256 for t in tokens)
            ):
                log.warning("ignoring a malformed prefill job")
                return
            self.jobs.append(_Job(request_id, tokens, start))
        elif op == "ack":
            request_id = message.get("id")
            if type(request_id) is int:
                self.acks[request_id] = message.get("ok") is True
        elif op == "stop":
            self.stopping = True

    def _prefill_batch(self) -> None:
        engine = self.engine
        batch: list[tuple[_Job, Sequence]] = []
        budget = self.spec.max_batch_tokens
        while self.jobs:
            job = self.jobs[0]
            context = job.tokens[:-1]  # the decode worker computes the last token
            if len(context) <= job.start:
                self.jobs.popleft()
                self._fail(job, "nothing to prefill remotely")
                continue
            seq = Sequence(job.request_id, context, SamplingParams(max_tokens=1))
            if not self._allocate(seq):
                if batch:
                    break  # after this batch's blocks are freed
                self.jobs.popleft()
                self._fail(job, "prompt does not fit the prefill worker's KV cache")
                continue
            new_tokens = len(context) - seq.num_computed
            if batch and new_tokens > budget:
                engine.blocks.free(seq)
                break
            budget -= new_tokens
            self.jobs.popleft()
            batch.append((job, seq))
        if not batch:
            return
        self.prompt_tokens_computed += sum(len(s.tokens) - s.num_computed for _, s in batch)
        self.prefix_hit_tokens += sum(s.num_cached for _, s in batch)
        started = time.perf_counter()
        engine.runner.run(Batch(True, [seq for _, seq in batch]))
        compute_ms = (time.perf_counter() - started) * 1000.0
        share = compute_ms / len(batch)
        for _, seq in batch:
            seq.num_computed = len(seq.tokens)
            engine.blocks.commit(seq)
        try:
            for job, seq in batch:
                kv = engine.read_kv(seq, job.start, len(seq.tokens))
                self._deliver(job, kv, share)
        finally:
            for _, seq in batch:
                engine.blocks.free(seq)
                engine.runner.forget(seq)

    def _allocate(self, seq: Sequence) -> bool:
        """Give ``seq`` its blocks and what its prefix cache and prefix tier have of it."""
        pager = self.engine.prefix_pager
        if pager is not None:
            return pager.allocate_now(seq)
        if not self.engine.blocks.can_allocate(seq):
            return False
        self.engine.blocks.allocate(seq)
        return True

    def _deliver(self, job: _Job, kv: torch.Tensor, compute_ms: float) -> None:
        header = KvHeader.for_tensor(job.request_id, job.start, kv, compute_ms)
        for _ in range(_MAX_SENDS):
            payload = kv
            if self.corrupt_left > 0:
                self.corrupt_left -= 1
                payload = kv.clone()
                payload.view(-1)[0] += 1.0
            self.conn.send_bytes(encode_message(header.to_message()))
            self.group.send([payload], 0, _KV_TAG).wait()
            # The KV stays here until the decode worker says it arrived intact.
            while job.request_id not in self.acks and not self.stopping:
                self._handle(self.conn.recv_bytes())
            if self.acks.pop(job.request_id, False) or self.stopping:
                return
        self._fail(job, f"KV checksum failed {_MAX_SENDS} times")

    def _fail(self, job: _Job, message: str) -> None:
        self.conn.send_bytes(encode_message({"op": "failed", "id": job.request_id, "msg": message}))
