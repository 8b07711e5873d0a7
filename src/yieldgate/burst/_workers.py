"""A burst sent from several processes (``BurstConfig.workers``), reported as one.

The parent deals each strategy's requests round-robin to N worker processes
(``multiprocessing``, spawned: no state inherited from the parent), which
keep their arrival times, so the merged arrival process is the one asked
for. Per strategy:

1. the parent starts the server (``serve_args``) and sends every worker
   its job; each opens its own client to the target and answers ``ready``;
2. once all are ready, the parent reads the server's counters and sends
   ``go`` with an instant a little ahead on ``time.monotonic()`` (one clock
   for every process of the machine): every worker counts from it, so the
   start-up of processes and clients is outside the measurement;
3. each worker runs its share as one process runs a whole strategy
   (``_strategy_run``; its own Gate: N workers are N clients) and sends
   back its raw records; the parent samples the server meanwhile, then
   reads its counters again and merges (``_merge``).

The workers live for the whole run (every strategy) and are stopped, killed
if need be, when it ends: normally, on an error or on Ctrl-C; a worker whose
parent dies (``SIGKILL``, say) ends itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import anyio

from yieldgate.burst._config import BurstConfig, burst_prompts, burst_report, sim_ramp
from yieldgate.burst._merge import (
    Part,
    merge_requests,
    merge_timelines,
    split_concurrency,
    split_requests,
)
from yieldgate.burst._metrics import AttemptRecord
from yieldgate.burst._progress import Progress
from yieldgate.burst._results import BurstReport, ServerCounters, StrategyResult, summarise
from yieldgate.burst._stop import Stop, Watched
from yieldgate.burst._strategies import Strategy
from yieldgate.burst._strategy_run import Live, live_server, run_async, run_one, wait_ready
from yieldgate.burst._targets import Request, Target, open_target

__all__ = ["run_workers"]

_log = logging.getLogger("yieldgate.burst")

# How far ahead of the go message the common start lies: time for a pipe
# message to reach every worker, even on a busy machine.
_LEAD_S = 0.1
_STARTUP_TIMEOUT_S = 120.0
_STOP_TIMEOUT_S = 5.0
_POLL_S = 0.05


class _Aborted(Exception):
    """The parent called a strategy off before its go."""


class _CutShort(Exception):
    """The run was cut short (``Stop``): a signal, or a worker or the server died."""


@dataclass(slots=True)
class _WorkerShare:
    """``_strategy_run.Share`` in a worker: the ready/go barrier over the parent's pipe."""

    number: int
    indices: Sequence[int]
    conn: Any

    async def start(self) -> float:
        self.conn.send(("ready",))
        message = await anyio.to_thread.run_sync(self.conn.recv)
        if message[0] != "go":
            raise _Aborted
        t0: float = message[1]
        await anyio.sleep_until(t0)
        return t0

    def collect(
        self,
        requests: list[Request],
        timeline: list[Any],
        attempts: int,
        yields: int,
        attempt_log: list[AttemptRecord],
    ) -> Part:
        return Part(
            worker=self.number,
            requests=requests,
            timeline=timeline,
            attempts=attempts,
            yields=yields,
            attempt_log=attempt_log,
        )


class _Count:
    """Progress in a worker: requests finished, in this worker's slot of a shared array."""

    def __init__(self, counts: Any, number: int) -> None:
        self.counts, self.number = counts, number

    def start(self, label: str, total: int) -> None:
        pass

    def advance(self) -> None:
        self.counts[self.number] += 1

    def finish(self, result: StrategyResult) -> None:
        pass


def _exit_with_parent() -> None:
    """End this worker at once if its parent dies (killed, it could not stop it)."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        parent.join()
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _worker_main(
    number: int,
    conn: Any,
    config: BurstConfig,
    offsets: Sequence[float],
    prompts: Sequence[str],
    counts: Any,
) -> None:
    """A worker process: run each job the parent sends until ``stop`` (or the pipe closes)."""
    # A Ctrl-C at the terminal reaches the whole process group: the parent alone ends
    # the run, and then stops its workers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _exit_with_parent()
    progress = _Count(counts, number)
    with contextlib.suppress(KeyboardInterrupt, EOFError, BrokenPipeError):
        while True:
            message = conn.recv()
            if message[0] != "job":
                return
            _, run_index, target, indices = message
            share = _WorkerShare(number, indices, conn)
            strategy = config.strategies[run_index]
            try:
                # A worker neither scrapes nor samples the server: its parent reads the server.
                live = Live(target)
                part = run_async(
                    run_one, config, strategy, live, offsets, prompts, run_index, progress, share
                )
            except _Aborted:
                continue
            except Exception:
                conn.send(("error", traceback.format_exc()))
                continue
            conn.send(("done", part))


class _Pool:
    """The worker processes of a run, and the messages to and from them."""

    def __init__(
        self, config: BurstConfig, offsets: Sequence[float], prompts: Sequence[str], stop: Stop
    ):
        self.stop = stop
        self.workers = config.workers
        self.shares = split_requests(config.requests, self.workers)
        caps = split_concurrency(config.concurrency, self.workers)
        context = multiprocessing.get_context("spawn")
        self.counts = context.RawArray("q", self.workers)
        self.conns: list[Any] = []
        self.processes: list[Any] = []
        for number in range(self.workers):
            ours, theirs = context.Pipe()
            # Each worker jitters from its own seed; arrivals and prompts come fixed.
            own = dataclasses.replace(
                config,
                workers=1,
                concurrency=caps[number],
                wait_ready=False,
                seed=config.seed + 7919 * number,
            )
            process = context.Process(
                target=_worker_main,
                args=(number, theirs, own, list(offsets), list(prompts), self.counts),
                name=f"yieldgate-burst-worker-{number}",
                daemon=True,
            )
            self.conns.append(ours)
            self.processes.append(process)
            process.start()
            theirs.close()

    def send_jobs(self, run_index: int, target: Target) -> None:
        for number, conn in enumerate(self.conns):
            self.counts[number] = 0
            conn.send(("job", run_index, target, self.shares[number]))

    def go(self, t0: float) -> None:
        for conn in self.conns:
            conn.send(("go", t0))

    def finished(self) -> int:
        return sum(self.counts)

    def poll(self, expect: str, answers: dict[int, Any]) -> bool:
        """Read what has come; ``True`` once every worker has answered ``expect``.

        A worker's error raises ``RuntimeError``, a stop or a dead worker ``_CutShort``
        (the others are stopped by ``close``)."""
        if self.stop.check():
            raise _CutShort
        for number, (conn, process) in enumerate(zip(self.conns, self.processes, strict=True)):
            if number in answers:
                continue
            if conn.poll():
                message = conn.recv()
                if message[0] == "error":
                    _log.debug("burst worker %d failed:\n%s", number, message[1])
                    last = message[1].strip().splitlines()[-1]
                    raise RuntimeError(f"burst worker {number} failed: {last}")
                if message[0] == expect:
                    answers[number] = message[1] if len(message) > 1 else None
                    continue
            if not process.is_alive() and self.stop.check():
                raise _CutShort
        return len(answers) == self.workers

    def watched(self) -> list[Watched]:
        """The workers, as ``Stop`` watches them."""
        return [
            Watched(f"burst worker {number}", process.pid, _exitcode(process))
            for number, process in enumerate(self.processes)
        ]

    def close(self) -> None:
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.send(("stop",))
            # A worker reads the stop, or the end of the pipe, whatever it waits for.
            conn.close()
        # Cut short, a worker may be mid-run: it reads no stop then, and is terminated.
        deadline = time.monotonic() + (0.0 if self.stop.is_set() else _STOP_TIMEOUT_S)
        for process in self.processes:
            process.join(max(0.0, deadline - time.monotonic()))
        for process in self.processes:
            if process.is_alive():
                process.terminate()
                process.join(1.0)
            if process.is_alive():
                process.kill()
                process.join()


def _exitcode(process: Any) -> Callable[[], int | None]:
    def exitcode() -> int | None:
        code: int | None = process.exitcode
        return code

    return exitcode


@contextlib.contextmanager
def _pool(
    config: BurstConfig, offsets: Sequence[float], prompts: Sequence[str], stop: Stop
) -> Iterator[_Pool]:
    pool = _Pool(config, offsets, prompts, stop)
    try:
        with stop.watching(*pool.watched()):
            yield pool
    finally:
        pool.close()


async def _await(pool: _Pool, expect: str, timeout_s: float | None) -> dict[int, Any]:
    answers: dict[int, Any] = {}
    with anyio.fail_after(timeout_s):
        # The answers come down pipes from other processes: nothing here to wait on.
        while not pool.poll(expect, answers):  # noqa: ASYNC110
            await anyio.sleep(_POLL_S)
    return answers


async def _drive(
    pool: _Pool,
    config: BurstConfig,
    strategy: Strategy,
    live: Live,
    run_index: int,
    progress: Progress,
) -> StrategyResult:
    """One strategy across the pool: barrier, go, server samples, merge."""
    target = live.target
    # The parent sends no request: its client only reads the server's counters.
    counter_gate = Strategy(name="naive").make_gate()
    samples: list[tuple[float, dict[str, Any]]] = []
    async with open_target(target, counter_gate, config.workload, dialect=config.dialect) as (
        _,
        stats,
    ):
        pool.send_jobs(run_index, target)
        if config.wait_ready:
            await wait_ready(stats, config.ready_timeout_s)
        await _await(pool, "ready", _STARTUP_TIMEOUT_S)
        before = await stats()
        t0 = time.monotonic() + _LEAD_S
        pool.go(t0)
        answers: dict[int, Any] = {}
        shown = 0
        next_sample = t0
        while not pool.poll("done", answers):
            finished = pool.finished()
            for _ in range(finished - shown):
                progress.advance()
            shown = finished
            now = time.monotonic()
            if before is not None and now >= next_sample:
                counters = await stats()
                if counters is not None:
                    samples.append((time.monotonic() - t0, counters))
                next_sample = now + config.sample_interval_s
            await anyio.sleep(_POLL_S)
        for _ in range(pool.finished() - shown):
            progress.advance()
        after = await stats()
    parts: list[Part] = [answers[n] for n in range(pool.workers)]
    requests = merge_requests(parts, config.requests)
    server = None
    if before is not None and after is not None:
        server = ServerCounters.between(before, after)
        # The counters after the run belong on the timeline's last point.
        last = max((p.timeline[-1].t_s for p in parts if p.timeline), default=0.0)
        samples = [(t, c) for t, c in samples if t < last] + [(last, after)]
    cold_start_s, ramp_s = sim_ramp(config.serve_args)
    return summarise(
        strategy=strategy.name,
        label=strategy.label,
        requests=requests,
        attempts=sum(p.attempts for p in parts),
        yields=sum(p.yields for p in parts),
        slo=config.slo,
        stream=config.workload.stream,
        server=server,
        timeline=merge_timelines([p.timeline for p in parts], samples, before),
        cold_start_s=cold_start_s,
        ramp_s=ramp_s,
        # Every worker's times count from the same go: their attempts are one log.
        attempt_log=sorted((r for p in parts for r in p.attempt_log), key=lambda r: r.end_s),
        priorities={r.index: r.priority for r in requests if r.priority is not None} or None,
    )


def run_workers(config: BurstConfig, progress: Progress, stop: Stop) -> BurstReport:
    """``run_burst`` for ``config.workers`` > 1: every strategy sent from the pool. Cut
    short (``stop``), the strategy running then has no result: its parts are in the
    workers, which are stopped."""
    target = Target.parse(config.target)
    offsets = config.profile.offsets(config.requests, seed=config.seed)
    prompts = burst_prompts(config)
    results: list[StrategyResult] = []
    with _pool(config, offsets, prompts, stop) as pool:
        for n, strategy in enumerate(config.strategies):
            if stop.check():
                break
            try:
                with live_server(config, target, stop) as live:
                    progress.start(strategy.label, config.requests)
                    result = run_async(_drive, pool, config, strategy, live, n, progress)
                    progress.finish(result)
            except _CutShort:
                break
            results.append(result)
    return burst_report(config, results, stop.reason)
