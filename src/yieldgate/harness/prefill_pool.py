"""The decode worker's side of disaggregated prefill: the prefill worker processes.

``PrefillPool`` starts N ``python -m yieldgate.harness._worker_main``
processes, takes their control connections on a loopback listener (a
one-time key authenticates them), joins them in a gloo group (rank 0 is this
process), and runs one link thread per worker that reads its control
connection and receives its KV transfers. What arrives is
handed to callbacks (the engine thread's inbox):

- ``on_kv(request_id, start, kv, stats)``: a checked transfer;
- ``on_failed(request_id, reason)``: the worker gave up on a request, or
  died with it assigned: the decode worker prefills it itself;
- ``on_dead(worker)``: a worker is gone; nothing is routed to it again.

A transfer whose header does not fit, or whose checksum does not match, is
answered ``ack ok: false`` and sent again by the worker.

Each worker has a gloo group of its own (world size 2: this process is rank
0, the worker rank 1), built from its own store, so workers can come and go
while serving (the planner's ``launch_worker`` / ``adopt`` and ``retire``).
A retired worker takes no new job, finishes those it has, and is then told
to stop; its exit is not a death (no ``on_dead``).

With ``priority`` on, jobs beyond a worker's window are held here and sent
in priority order (``_prefill_queue``); off, every job is sent at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, Listener
from typing import Any

import torch

from yieldgate.harness._prefill_state import TransferStats, WorkerState
from yieldgate.harness.prefill_worker import WorkerSpec
from yieldgate.harness.transfer import (
    DTYPES,
    KvHeader,
    TransferError,
    connect_group,
    decode_message,
    encode_message,
    kv_checksum,
    tcp_store,
)

__all__ = ["PrefillPool", "TransferStats", "WorkerState"]

log = logging.getLogger("yieldgate.harness.prefill")

_KV_TAG = 0


@dataclass(slots=True)
class _Spawn:
    """A worker process started, not yet joined."""

    index: int
    process: subprocess.Popen[str]
    store: Any
    listener: Listener


class PrefillPool:
    """N prefill worker processes and the links to them."""

    def __init__(
        self,
        num_workers: int,
        spec: WorkerSpec,
        *,
        on_kv: Callable[[int, int, torch.Tensor, TransferStats], None],
        on_failed: Callable[[int, str], None],
        on_dead: Callable[[int], None],
        priority: bool = False,
        age_bound: int = 1000,
        window_tokens: int | None = None,
    ) -> None:
        if num_workers < 0:
            raise ValueError("num_workers must be >= 0")
        self.num_workers = num_workers
        self.priority = priority
        self.age_bound = age_bound
        # About two batches: one computing, one waiting to be batched next.
        self.window_tokens = 2 * spec.max_batch_tokens if window_tokens is None else window_tokens
        self.spec = spec
        self._on_kv = on_kv
        self._on_failed = on_failed
        self._on_dead = on_dead
        self.workers: list[WorkerState] = []
        self._threads: list[threading.Thread] = []
        self._closing = False
        self._index_lock = threading.Lock()
        self._next_index = 0
        # Started but not adopted yet: close() kills them, so none outlives the pool.
        self._launching: set[subprocess.Popen[str]] = set()
        cfg = spec.engine_config().model
        self._expect = (cfg.n_layers, cfg.n_heads, cfg.d_model // cfg.n_heads)
        self.bytes_total = 0
        self.transfer_ms_total = 0.0
        self.started_total = 0
        self.stopped_total = 0

    def start(self) -> None:
        """Start the first ``num_workers`` workers (side by side) and wait until each is ready."""
        spawns: list[_Spawn] = []
        try:
            for _ in range(self.num_workers):
                spawns.append(self._spawn())
            joined = [self._join(spawn) for spawn in spawns]
        except BaseException:
            for spawn in spawns:
                _kill(spawn.process)
            raise
        for worker in joined:
            self.adopt(worker)

    def launch_worker(self) -> WorkerState:
        """Start one more worker and wait until it is ready (blocking: not the engine thread).

        It takes no job until ``adopt``.
        """
        spawn = self._spawn()
        try:
            return self._join(spawn)
        except BaseException:
            _kill(spawn.process)
            raise

    def adopt(self, worker: WorkerState) -> None:
        """Put a launched worker into service: its link thread starts, jobs may go to it."""
        with self._index_lock:
            self._launching.discard(worker.process)
        self.workers.append(worker)
        self.started_total += 1
        thread = threading.Thread(
            target=self._link, args=(worker,), name=f"yieldgate-kv-link-{worker.index}"
        )
        thread.daemon = True
        thread.start()
        self._threads.append(thread)

    def _spawn(self) -> _Spawn:
        with self._index_lock:
            if self._closing:
                raise RuntimeError("the prefill pool is closed")
            index = self._next_index
            self._next_index += 1
        timeout_s = self.spec.timeout_s
        store = tcp_store(0, 2, is_master=True, timeout_s=timeout_s)
        authkey = secrets.token_bytes(32)
        listener = Listener(("127.0.0.1", 0), authkey=authkey)
        launch = {
            "rank": 1,
            "world_size": 2,
            "store_port": store.port,
            "control": list(listener.address),
            "authkey": authkey.hex(),
            "spec": dataclasses.asdict(self.spec),
        }
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", "yieldgate.harness._worker_main"],
                stdin=subprocess.PIPE,
                text=True,
            )
        except BaseException:
            listener.close()
            raise
        with self._index_lock:
            self._launching.add(process)
        assert process.stdin is not None
        process.stdin.write(json.dumps(launch))
        process.stdin.close()
        return _Spawn(index, process, store, listener)

    def _join(self, spawn: _Spawn) -> WorkerState:
        """The spawned worker connected, in its gloo group, and ready; raises if not in time."""
        timeout_s = self.spec.timeout_s
        deadline = time.monotonic() + timeout_s
        try:
            conn = self._accept(spawn.listener, spawn.process, timeout_s)
        finally:
            spawn.listener.close()
        try:
            group = connect_group(spawn.store, 0, 2, timeout_s)
            kv_blocks = _await_ready(conn, spawn.index, deadline)
        except BaseException:
            conn.close()
            raise
        return WorkerState(
            index=spawn.index,
            rank=1,
            process=spawn.process,
            conn=conn,
            group=group,
            kv_blocks=kv_blocks,
        )

    @staticmethod
    def _accept(listener: Listener, process: subprocess.Popen[str], timeout_s: float) -> Connection:
        """The worker's control connection; one that does not come in time is an error."""
        timer = threading.Timer(timeout_s, listener.close)  # unblocks accept() on timeout
        timer.start()
        try:
            while True:
                try:
                    conn = listener.accept()
                except OSError:
                    raise RuntimeError("a prefill worker did not connect in time") from None
                hello = decode_message(conn.recv_bytes())
                if hello.get("op") != "hello" or hello.get("rank") != 1:
                    conn.close()
                    continue
                return conn
        finally:
            timer.cancel()

    # -- from the engine thread ----------------------------------------------

    def worker(self, index: int) -> WorkerState:
        """The worker of this index (indices are never reused)."""
        for worker in self.workers:
            if worker.index == index:
                return worker
        raise KeyError(index)

    def submit(
        self, index: int, request_id: int, tokens: list[int], start: int, *, rank: int = 1
    ) -> bool:
        """Give a prefill job to worker ``index``; ``False`` if it is gone or retired.

        ``rank`` is the request's (``Sequence.rank``; 0: high priority). With
        priority on the job may be held here first; a failed send then ends the link.
        """
        worker = self.worker(index)
        with worker.lock:
            if not worker.active:
                return False
            worker.assigned[request_id] = len(tokens) - 1 - start
            if rank == 0:
                worker.high.add(request_id)
            worker.jobs_total += 1
            if self.priority:
                worker.jobs.hold(request_id, tokens, start, rank)
                self._pump(worker)
                return True
            worker.jobs.mark_sent(request_id, worker.assigned[request_id])
            try:
                worker.conn.send_bytes(
                    encode_message(
                        {"op": "prefill", "id": request_id, "tokens": tokens, "start": start}
                    )
                )
            except OSError:
                self._forget(worker, request_id)
                return False
        return True

    def _pump(self, worker: WorkerState) -> None:
        """Send held jobs in priority order while the window has room (``worker.lock`` held)."""
        while worker.alive:
            job = worker.jobs.next_to_send(self.age_bound, self.window_tokens)
            if job is None:
                return
            try:
                worker.conn.send_bytes(encode_message(job.message()))
            except OSError:
                return  # the link sees the connection gone and fails what is assigned

    def cancel(self, request_id: int) -> bool:
        """Drop a job still held here (its request was aborted); whether one was."""
        for worker in list(self.workers):
            with worker.lock:
                if worker.jobs.is_held(request_id):
                    self._forget(worker, request_id)
                    return True
        return False

    @staticmethod
    def _forget(worker: WorkerState, request_id: int) -> bool:
        """Remove every record of a job (``worker.lock`` held); whether it was assigned."""
        worker.high.discard(request_id)
        worker.jobs.remove(request_id)
        return worker.assigned.pop(request_id, None) is not None

    def high_jobs_queued(self) -> int:
        """High-priority prefills queued or running at live workers."""
        return sum(len(worker.high) for worker in self.workers if worker.alive)

    def active_workers(self) -> list[WorkerState]:
        return [worker for worker in self.workers if worker.active]

    def retire(self, index: int) -> None:
        """Take worker ``index`` out of service: no new job; stopped once drained."""
        worker = self.worker(index)
        worker.accepting = False
        self.stop_if_drained(worker)

    def stop_if_drained(self, worker: WorkerState) -> bool:
        """Tell a retired worker with nothing assigned to stop; whether it was told."""
        with worker.lock:
            if worker.accepting or worker.stopped or worker.assigned:
                return False
            worker.stopped = True
            with contextlib.suppress(OSError):
                worker.conn.send_bytes(encode_message({"op": "stop"}))
        self.stopped_total += 1
        log.info("prefill worker %d (pid %d) retired", worker.index, worker.process.pid)
        return True

    # -- link threads ---------------------------------------------------------

    def _send(self, worker: WorkerState, message: dict[str, Any]) -> None:
        with worker.lock:
            worker.conn.send_bytes(encode_message(message))

    def _link(self, worker: WorkerState) -> None:
        try:
            while True:
                message = decode_message(worker.conn.recv_bytes())
                op = message["op"]
                if op == "kv":
                    self._receive(worker, message)
                elif op == "failed":
                    request_id = message.get("id")
                    if type(request_id) is int and self._unassign(worker, request_id):
                        self._on_failed(request_id, str(message.get("msg", "prefill failed")))
        except (EOFError, OSError, RuntimeError, TransferError) as exc:
            if not self._closing and not worker.stopped:
                log.warning("prefill worker %d lost: %s", worker.index, exc)
        finally:
            self._lose(worker)

    def _receive(self, worker: WorkerState, message: dict[str, Any]) -> None:
        assert worker.group is not None
        header = KvHeader.from_message(message, expect=self._expect)
        kv = torch.empty(header.shape, dtype=DTYPES[header.dtype])
        started = time.perf_counter()
        # A failure here (the worker died mid-transfer) ends the link.
        worker.group.recv([kv], worker.rank, _KV_TAG).wait()
        took_ms = (time.perf_counter() - started) * 1000.0
        if kv_checksum(kv) != header.checksum:
            worker.checksum_failures += 1
            log.warning("KV for request %d failed its checksum; asking again", header.request_id)
            self._send(worker, {"op": "ack", "id": header.request_id, "ok": False})
            return
        self._send(worker, {"op": "ack", "id": header.request_id, "ok": True})
        worker.transfers += 1
        self.bytes_total += header.nbytes
        self.transfer_ms_total += took_ms
        if self._unassign(worker, header.request_id):
            stats = TransferStats(header.nbytes, took_ms, header.compute_ms)
            self._on_kv(header.request_id, header.start, kv, stats)

    def _unassign(self, worker: WorkerState, request_id: int) -> bool:
        with worker.lock:
            found = self._forget(worker, request_id)
            self._pump(worker)  # room in the window: the next held job goes
            return found

    def _lose(self, worker: WorkerState) -> None:
        with worker.lock:
            worker.alive = False
            orphans = list(worker.assigned)
            worker.assigned.clear()
            worker.high.clear()
            worker.jobs.clear()
        for request_id in orphans:
            self._on_failed(request_id, f"prefill worker {worker.index} died")
        if not self._closing and not worker.stopped:
            self._on_dead(worker.index)

    # -- lifecycle ------------------------------------------------------------

    def close(self, timeout_s: float = 5.0) -> None:
        with self._index_lock:
            self._closing = True
            launching = list(self._launching)
            self._launching.clear()
        for process in launching:
            _kill(process)
        for worker in self.workers:
            if worker.stopped:
                continue
            with contextlib.suppress(OSError):
                self._send(worker, {"op": "stop"})
        deadline = time.monotonic() + timeout_s
        for worker in self.workers:
            try:
                worker.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait(1.0)
            worker.conn.close()
        for thread in self._threads:
            thread.join(1.0)

    def stats(self) -> dict[str, Any]:
        workers = [
            {
                "index": worker.index,
                "pid": worker.process.pid,
                "alive": worker.alive,
                "state": worker.state,
                "queued": worker.queued,
                "held": len(worker.jobs.held),
                "jobs_total": worker.jobs_total,
                "transfers": worker.transfers,
                "checksum_failures": worker.checksum_failures,
                "kv_blocks": worker.kv_blocks,
            }
            for worker in self.workers
        ]
        return {
            "prefill_workers": workers,
            "prefill_queue": sum(worker.queued for worker in self.workers),
            "prefill_workers_active": sum(worker.active for worker in self.workers),
            "prefill_workers_started": self.started_total,
            "prefill_workers_stopped": self.stopped_total,
            "transfer_bytes_total": self.bytes_total,
            "transfer_ms_total": round(self.transfer_ms_total, 3),
        }


def _await_ready(conn: Connection, index: int, deadline: float) -> int:
    """Wait for the worker's ``ready``; the KV blocks it says it allocated."""
    if not conn.poll(max(0.0, deadline - time.monotonic())):
        raise RuntimeError(f"prefill worker {index} did not start in time")
    ready = decode_message(conn.recv_bytes())
    if ready.get("op") != "ready":
        raise RuntimeError(f"prefill worker {index} did not say ready")
    kv_blocks = ready.get("kv_blocks")
    return kv_blocks if type(kv_blocks) is int else 0


def _kill(process: subprocess.Popen[str]) -> None:
    with contextlib.suppress(OSError):
        process.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(5.0)
