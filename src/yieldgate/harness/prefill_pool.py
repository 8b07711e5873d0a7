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
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, Listener
from typing import Any

import torch

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


@dataclass(frozen=True, slots=True)
class TransferStats:
    nbytes: int
    transfer_ms: float
    compute_ms: float


@dataclass(slots=True)
class WorkerState:
    """What the decode worker knows of one prefill worker."""

    index: int
    rank: int
    process: subprocess.Popen[str]
    conn: Connection
    alive: bool = True
    assigned: dict[int, int] = field(default_factory=dict)  # request id -> tokens
    lock: threading.Lock = field(default_factory=threading.Lock)
    jobs_total: int = 0
    transfers: int = 0
    checksum_failures: int = 0

    @property
    def queued(self) -> int:
        return len(self.assigned)

    @property
    def queued_tokens(self) -> int:
        return sum(self.assigned.values())


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
    ) -> None:
        if num_workers < 1:
            raise ValueError("a prefill pool needs at least one worker")
        self.num_workers = num_workers
        self.spec = spec
        self._on_kv = on_kv
        self._on_failed = on_failed
        self._on_dead = on_dead
        self.workers: list[WorkerState] = []
        self._group: Any = None
        self._threads: list[threading.Thread] = []
        self._closing = False
        cfg = spec.engine_config().model
        self._expect = (cfg.n_layers, cfg.n_heads, cfg.d_model // cfg.n_heads)
        self.bytes_total = 0
        self.transfer_ms_total = 0.0

    def start(self) -> None:
        """Start the workers and wait until each has joined and loaded its model."""
        world = self.num_workers + 1
        timeout_s = self.spec.timeout_s
        store = tcp_store(0, world, is_master=True, timeout_s=timeout_s)
        authkey = secrets.token_bytes(32)
        listener = Listener(("127.0.0.1", 0), authkey=authkey)
        processes = []
        try:
            for index in range(self.num_workers):
                launch = {
                    "rank": index + 1,
                    "world_size": world,
                    "store_port": store.port,
                    "control": list(listener.address),
                    "authkey": authkey.hex(),
                    "spec": dataclasses.asdict(self.spec),
                }
                process = subprocess.Popen(
                    [sys.executable, "-m", "yieldgate.harness._worker_main"],
                    stdin=subprocess.PIPE,
                    text=True,
                )
                assert process.stdin is not None
                process.stdin.write(json.dumps(launch))
                process.stdin.close()
                processes.append(process)
            conns = self._accept(listener, processes, timeout_s)
        finally:
            listener.close()
        for index, process in enumerate(processes):
            self.workers.append(
                WorkerState(index=index, rank=index + 1, process=process, conn=conns[index + 1])
            )
        self._group = connect_group(store, 0, world, timeout_s)
        deadline = time.monotonic() + timeout_s
        for worker in self.workers:
            if not worker.conn.poll(max(0.0, deadline - time.monotonic())):
                raise RuntimeError(f"prefill worker {worker.index} did not start in time")
            if decode_message(worker.conn.recv_bytes()).get("op") != "ready":
                raise RuntimeError(f"prefill worker {worker.index} did not say ready")
        for worker in self.workers:
            thread = threading.Thread(
                target=self._link, args=(worker,), name=f"yieldgate-kv-link-{worker.index}"
            )
            thread.daemon = True
            thread.start()
            self._threads.append(thread)

    def _accept(
        self, listener: Listener, processes: list[subprocess.Popen[str]], timeout_s: float
    ) -> dict[int, Connection]:
        """Each worker's control connection, by rank; a worker that exits early is an error."""
        conns: dict[int, Connection] = {}
        timer = threading.Timer(timeout_s, listener.close)  # unblocks accept() on timeout
        timer.start()
        try:
            while len(conns) < len(processes):
                try:
                    conn = listener.accept()
                except OSError:
                    raise RuntimeError("prefill workers did not connect in time") from None
                hello = decode_message(conn.recv_bytes())
                rank = hello.get("rank")
                if hello.get("op") != "hello" or type(rank) is not int or rank in conns:
                    conn.close()
                    continue
                conns[rank] = conn
        except BaseException:
            for conn in conns.values():
                conn.close()
            for process in processes:
                process.kill()
            raise
        finally:
            timer.cancel()
        return conns

    # -- from the engine thread ----------------------------------------------

    def submit(self, index: int, request_id: int, tokens: list[int], start: int) -> bool:
        """Send a prefill job to worker ``index``; ``False`` if it is gone."""
        worker = self.workers[index]
        with worker.lock:
            if not worker.alive:
                return False
            worker.assigned[request_id] = len(tokens) - 1 - start
            worker.jobs_total += 1
            try:
                worker.conn.send_bytes(
                    encode_message(
                        {"op": "prefill", "id": request_id, "tokens": tokens, "start": start}
                    )
                )
            except OSError:
                del worker.assigned[request_id]
                return False
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
            if not self._closing:
                log.warning("prefill worker %d lost: %s", worker.index, exc)
        finally:
            self._lose(worker)

    def _receive(self, worker: WorkerState, message: dict[str, Any]) -> None:
        assert self._group is not None
        header = KvHeader.from_message(message, expect=self._expect)
        kv = torch.empty(header.shape, dtype=DTYPES[header.dtype])
        started = time.perf_counter()
        # A failure here (the worker died mid-transfer) ends the link.
        self._group.recv([kv], worker.rank, _KV_TAG).wait()
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
            return worker.assigned.pop(request_id, None) is not None

    def _lose(self, worker: WorkerState) -> None:
        with worker.lock:
            worker.alive = False
            orphans = list(worker.assigned)
            worker.assigned.clear()
        for request_id in orphans:
            self._on_failed(request_id, f"prefill worker {worker.index} died")
        if not self._closing:
            self._on_dead(worker.index)

    # -- lifecycle ------------------------------------------------------------

    def close(self, timeout_s: float = 5.0) -> None:
        self._closing = True
        for worker in self.workers:
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
                "pid": worker.process.pid,
                "alive": worker.alive,
                "queued": worker.queued,
                "jobs_total": worker.jobs_total,
                "transfers": worker.transfers,
                "checksum_failures": worker.checksum_failures,
            }
            for worker in self.workers
        ]
        return {
            "prefill_workers": workers,
            "prefill_queue": sum(worker.queued for worker in self.workers),
            "transfer_bytes_total": self.bytes_total,
            "transfer_ms_total": round(self.transfer_ms_total, 3),
        }
