"""What the decode worker knows of each prefill worker (``prefill_pool``'s records)."""

from __future__ import annotations

import subprocess
import threading
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from yieldgate.harness._prefill_queue import JobQueue

__all__ = ["TransferStats", "WorkerState"]


@dataclass(frozen=True, slots=True)
class TransferStats:
    nbytes: int
    transfer_ms: float
    compute_ms: float


@dataclass(slots=True)
class WorkerState:
    """What the decode worker knows of one prefill worker.

    ``alive`` until its process is lost; ``accepting`` until it is retired
    (then it drains); ``stopped`` once told to stop after draining.
    """

    index: int
    rank: int
    process: subprocess.Popen[str]
    conn: Connection
    group: Any = None
    alive: bool = True
    accepting: bool = True
    stopped: bool = False
    assigned: dict[int, int] = field(default_factory=dict)  # request id -> tokens
    high: set[int] = field(default_factory=set)  # of those, the high-priority ones
    jobs: JobQueue = field(default_factory=JobQueue)  # of those, the sent and the held
    lock: threading.Lock = field(default_factory=threading.Lock)
    jobs_total: int = 0
    transfers: int = 0
    checksum_failures: int = 0
    kv_blocks: int = 0  # the worker's own KV pool, as it reported when ready

    @property
    def queued(self) -> int:
        return len(self.assigned)

    @property
    def queued_tokens(self) -> int:
        return sum(self.assigned.values())

    @property
    def active(self) -> bool:
        """Whether new jobs may go to it."""
        return self.alive and self.accepting

    @property
    def state(self) -> str:
        if self.stopped:
            return "stopped"
        if not self.alive:
            return "dead"
        return "active" if self.accepting else "draining"
