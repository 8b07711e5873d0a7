"""Running a burst: arrivals on schedule, one strategy at a time, samples all along."""

from __future__ import annotations

import argparse
import contextlib
import datetime
import logging
import math
import os
import platform
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio

import yieldgate
from yieldgate.burst._profiles import ArrivalProfile
from yieldgate.burst._results import (
    BurstReport,
    Goal,
    ServerCounters,
    Slo,
    StrategyResult,
    TimelinePoint,
    summarise,
)
from yieldgate.burst._strategies import Strategy
from yieldgate.burst._targets import Request, StatsSource, Target, Workload, error_kind, open_target

__all__ = ["BurstConfig", "Progress", "run_burst"]

_log = logging.getLogger("yieldgate.burst")

# Failures that say the tool or the code under test is broken, not the upstream.
_BUGS = (AttributeError, TypeError, NameError, AssertionError, ImportError, LookupError)


@dataclass(frozen=True, slots=True, kw_only=True)
class BurstConfig:
    """One burst, run once per strategy.

    ``target`` is a URL (``tcp://HOST:PORT``, ``openai+http://...``,
    ``hf+http://...``, ``tgi+http://...``). With ``serve_args`` the tool
    starts ``yieldgate serve ARGS`` itself, fresh for each strategy, and the
    target may be a bare scheme (``tcp://``). Without it every strategy meets
    the same server, in whatever state the one before left it.

    ``concurrency`` caps the requests the generator keeps outstanding (as
    vLLM's ``--max-concurrency``): an arrival waits for one to end, and its
    clock (latency, TTFT) starts when it is sent. ``None``: no cap.

    ``workers`` > 1 sends the burst from that many processes, each its share
    of every strategy's requests, into one merged report (``_workers``).
    """

    target: str
    requests: int = 100
    profile: ArrivalProfile = field(default_factory=ArrivalProfile)
    strategies: tuple[Strategy, ...] = (Strategy(name="yieldgate"),)
    workload: Workload = field(default_factory=Workload)
    slo: Slo = field(default_factory=Slo)
    serve_args: tuple[str, ...] | None = None
    dialect: str | None = None
    wait_ready: bool = False
    ready_timeout_s: float = 120.0
    seed: int = 0
    sample_interval_s: float = 0.1
    scenario: str | None = None
    goal: Goal | None = None
    concurrency: int | None = None
    workers: int = 1

    def __post_init__(self) -> None:
        if self.requests < 1:
            raise ValueError("requests must be >= 1")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        if self.workers < 1:
            raise ValueError("workers must be >= 1")
        if self.concurrency is not None and self.concurrency < self.workers:
            raise ValueError("concurrency must be >= workers (each worker needs one slot)")
        if self.profile.kind == "trace" and self.requests > len(self.profile.entries):
            raise ValueError(
                f"the trace has {len(self.profile.entries)} requests, fewer than {self.requests}"
            )
        if not self.strategies:
            raise ValueError("give at least one strategy")
        if not (self.sample_interval_s > 0 and math.isfinite(self.sample_interval_s)):
            raise ValueError("sample_interval_s must be > 0")
        target = Target.parse(self.target)
        if self.serve_args is None:
            target.require_address()

    def as_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "target": self.target,
            "requests": self.requests,
            "concurrency": self.concurrency,
            "profile": self.profile.as_dict(),
            "strategies": [s.label for s in self.strategies],
            "stream": self.workload.stream,
            "prompt_tokens": [[t, w] for t, w in self.workload.prompt_tokens],
            "max_tokens": self.workload.max_tokens,
            "model": self.workload.model,
            "dialect": self.dialect,
            "slo": self.slo.as_dict(),
            "serve_args": None if self.serve_args is None else list(self.serve_args),
            "fresh_server_per_strategy": self.serve_args is not None,
            "wait_ready": self.wait_ready,
            "seed": self.seed,
            "sample_interval_s": self.sample_interval_s,
            "workers": self.workers,
        }


class Share(Protocol):
    """One worker's part of a strategy's run (``_workers``): which requests it sends,
    when the run starts on the common clock, and where its raw records go."""

    indices: Sequence[int]

    async def start(self) -> float:
        """Wait for the go; the ``time.monotonic()`` every worker counts from."""

    def collect(
        self, requests: list[Request], timeline: list[TimelinePoint], attempts: int, yields: int
    ) -> Any:
        """What the run returns in place of its summary."""


class Progress(Protocol):
    """What the runner reports while it goes (a progress bar, say)."""

    def start(self, label: str, total: int) -> None:
        """A strategy begins."""

    def advance(self) -> None:
        """One request finished (either way)."""

    def finish(self, result: StrategyResult) -> None:
        """A strategy ended."""


class _Silent:
    def start(self, label: str, total: int) -> None:
        pass

    def advance(self) -> None:
        pass

    def finish(self, result: StrategyResult) -> None:
        pass


def _machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "yieldgate": yieldgate.__version__,
    }


def _sim_ramp(serve_args: Sequence[str] | None) -> tuple[float, float]:
    """The ``--cold-start-s`` and ``--ramp-s`` a started server was given (for the bound)."""
    if serve_args is None:
        return 0.0, 0.0
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--cold-start-s", type=float, default=0.0)
    parser.add_argument("--ramp-s", type=float, default=0.0)
    known, _ = parser.parse_known_args(list(serve_args))
    return known.cold_start_s, known.ramp_s


def run_burst(config: BurstConfig, *, progress: Progress | None = None) -> BurstReport:
    """Run ``config`` once per strategy, in order, and return the report."""
    progress = progress or _Silent()
    if config.workers > 1:
        from yieldgate.burst._workers import run_workers

        return run_workers(config, progress)
    target = Target.parse(config.target)
    offsets = config.profile.offsets(config.requests, seed=config.seed)
    prompts = _prompts(config)
    results: list[StrategyResult] = []
    for n, strategy in enumerate(config.strategies):
        with _live_target(config, target) as live:
            progress.start(strategy.label, config.requests)
            result = _run_async(_run_one, config, strategy, live, offsets, prompts, n, progress)
            progress.finish(result)
        results.append(result)
    return BurstReport(
        config=config.as_dict(),
        machine=_machine(),
        created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        results=tuple(results),
        goal=config.goal,
    )


def _prompts(config: BurstConfig) -> list[str]:
    """The workload's prompts, each replaced by its trace entry's own where it has one."""
    prompts = config.workload.prompts(config.requests, config.seed)
    for i, entry in enumerate(config.profile.entries[: config.requests]):
        if entry.prompt is not None:
            prompts[i] = entry.prompt
        elif entry.prompt_chars is not None:
            prompts[i] = config.workload.prompt_of_length(i, entry.prompt_chars)
    return prompts


@contextlib.contextmanager
def _live_target(config: BurstConfig, target: Target) -> Iterator[Target]:
    if config.serve_args is None:
        yield target
        return
    # Here, not at the top: the server runs in a child process, and importing
    # yieldgate.burst loads no server module.
    from yieldgate.server import spawn

    with spawn(
        "--grace-s",
        "0",
        *config.serve_args,
        http=target.is_http,
        ready_timeout=config.ready_timeout_s,
    ) as server:
        address = server.http_address if target.is_http else None
        yield target.at(*(address or (server.host, server.port)))


def _run_async(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        options: dict[str, Any] = {}
    else:
        options = {"use_uvloop": True}
    return anyio.run(fn, *args, backend="asyncio", backend_options=options)


async def _wait_ready(stats: StatsSource, timeout_s: float) -> None:
    """Until the server says it is warm (``cold`` false); at once if it has no counters."""
    with anyio.fail_after(timeout_s):
        while True:
            counters = await stats()
            if counters is None or not counters.get("cold", False):
                return
            await anyio.sleep(0.1)


async def _run_one(
    config: BurstConfig,
    strategy: Strategy,
    target: Target,
    offsets: Sequence[float],
    prompts: Sequence[str],
    run_index: int,
    progress: Progress,
    share: Share | None = None,
) -> Any:
    gate = strategy.make_gate()
    requests = [Request(index=i, arrival_s=offset) for i, offset in enumerate(offsets)]
    for request, entry in zip(requests, config.profile.entries, strict=False):
        request.max_tokens = entry.max_tokens
    if share is not None:
        requests = [requests[i] for i in share.indices]
        prompts = [prompts[i] for i in share.indices]
    slots = None if config.concurrency is None else anyio.CapacityLimiter(config.concurrency)
    timeline: list[TimelinePoint] = []
    finished = {"ok": 0, "failed": 0}
    async with open_target(
        target,
        gate,
        config.workload,
        dialect=config.dialect,
        native_retries=strategy.native_retries(target.kind),
    ) as (send, stats):
        send = strategy.wrap(send, target.kind, seed=config.seed + run_index)
        if config.wait_ready:
            await _wait_ready(stats, config.ready_timeout_s)
        # A worker's server counters are read by its parent, once around all workers.
        before = await stats() if share is None else None
        t0 = time.monotonic() if share is None else await share.start()

        async def sample() -> None:
            counters = await stats() if before is not None else None
            g = gate.statistics()
            timeline.append(
                TimelinePoint(
                    t_s=time.monotonic() - t0,
                    client_inflight=g.window.inflight,
                    client_attempts=g.attempts,
                    client_yields=g.yields + g.overloads,
                    completed=finished["ok"],
                    failed=finished["failed"],
                    server_inflight=None if counters is None else counters["inflight"],
                    server_executed=None
                    if counters is None or before is None
                    else counters["executed_total"] - before["executed_total"],
                    server_yielded=None
                    if counters is None or before is None
                    else counters["yielded_total"] - before["yielded_total"],
                )
            )

        async def sampler(done: anyio.Event) -> None:
            while not done.is_set():
                await sample()
                with anyio.move_on_after(config.sample_interval_s):
                    await done.wait()

        reported: set[str] = set()

        async def one(request: Request, prompt: str) -> None:
            request.origin = t0
            await anyio.sleep_until(t0 + request.arrival_s)
            if slots is None:
                await attempt(request, prompt)
                return
            async with slots:
                # Closed loop: the request exists for its caller once it is sent.
                request.arrival_s = time.monotonic() - t0
                await attempt(request, prompt)

        async def attempt(request: Request, prompt: str) -> None:
            try:
                await send(prompt, request)
            except Exception as exc:
                request.error = error_kind(exc)
                finished["failed"] += 1
                if isinstance(exc, _BUGS) and request.error not in reported:
                    # Counted like any failure, but a bug must not hide as a statistic.
                    reported.add(request.error)
                    _log.error("request failed with a programming error", exc_info=exc)
            else:
                request.ok = True
                finished["ok"] += 1
            finally:
                request.end_s = time.monotonic() - t0
                progress.advance()

        done = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(sampler, done)
            async with anyio.create_task_group() as fire:
                for request, prompt in zip(requests, prompts, strict=True):
                    fire.start_soon(one, request, prompt)
            done.set()
        await sample()
        after = await stats() if share is None else None
    g = gate.statistics()
    if share is not None:
        return share.collect(requests, timeline, g.attempts, g.yields + g.overloads)
    server = None
    if before is not None and after is not None:
        server = ServerCounters.between(before, after)
    cold_start_s, ramp_s = _sim_ramp(config.serve_args)
    return summarise(
        strategy=strategy.name,
        label=strategy.label,
        requests=requests,
        attempts=g.attempts,
        yields=g.yields + g.overloads,
        slo=config.slo,
        stream=config.workload.stream,
        server=server,
        timeline=timeline,
        cold_start_s=cold_start_s,
        ramp_s=ramp_s,
    )
