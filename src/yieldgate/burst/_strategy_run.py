"""One strategy's run in one process: arrivals on schedule, samples all along.

``run_one`` sends a strategy's requests (every one, or a worker's ``Share``)
through its Gate at their arrival times, samples the client, the server's
counters and a Prometheus endpoint meanwhile, probes for the recovery time,
and summarises the run (or hands a worker's raw records to its ``Share``).
``live_server`` starts a fresh server for the run when asked, ``run_async``
runs it on asyncio (uvloop when installed). Both drivers of a burst use
them: ``_runner`` (one process) and ``_workers`` (a pool of processes).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import anyio

from yieldgate.burst._config import BurstConfig, sim_ramp
from yieldgate.burst._metrics import AttemptLog, AttemptRecord, Probe, draw_priorities, recovery
from yieldgate.burst._progress import Progress
from yieldgate.burst._results import ServerCounters, TimelinePoint, summarise
from yieldgate.burst._scrape import common_series, parse_exposition, process_rss_bytes
from yieldgate.burst._stop import Stop, Watched
from yieldgate.burst._strategies import Strategy
from yieldgate.burst._targets import Request, StatsSource, Target, error_kind, open_target
from yieldgate.burst._unreachable import UNREACHABLE, unreachable_line

__all__ = ["Live", "Share", "live_server", "run_async", "run_one", "wait_ready"]

_log = logging.getLogger("yieldgate.burst")

# How often a run checks whether it must stop (a signal came, a server died).
_WATCH_S = 0.05
# How long a run cut short waits for the server's last counters.
_LAST_READS_S = 2.0
# Failures that say the tool or the code under test is broken, not the upstream.
_BUGS = (AttributeError, TypeError, NameError, AssertionError, ImportError, LookupError)


class Share(Protocol):
    """One worker's part of a strategy's run (``_workers``): which requests it sends,
    when the run starts on the common clock, and where its raw records go."""

    indices: Sequence[int]

    async def start(self) -> float:
        """Wait for the go; the ``time.monotonic()`` every worker counts from."""

    def collect(
        self,
        requests: list[Request],
        timeline: list[TimelinePoint],
        attempts: int,
        yields: int,
        attempt_log: list[AttemptRecord],
    ) -> Any:
        """What the run returns in place of its summary."""


@dataclass(frozen=True, slots=True)
class Live:
    """The target a strategy meets, the started server's process id and what to scrape."""

    target: Target
    pid: int | None = None
    scrape: str | None = None


@contextlib.contextmanager
def live_server(config: BurstConfig, target: Target, stop: Stop) -> Iterator[Live]:
    """The target a strategy meets: a server started for it (``serve_args``), which
    ``stop`` watches until it is stopped, or the configured target."""
    if config.serve_args is None:
        yield Live(target, scrape=config.scrape)
        return
    with _live_target(config, target) as (live, server):
        auto = None
        if config.scrape_auto and server.http_address is not None:
            auto = f"http://{server.http_address[0]}:{server.http_address[1]}/metrics"
        watched = Watched(
            "the server the tool started", server.pid, server.poll, lambda: server.stderr
        )
        # Which process serves which target: what to look for when one dies.
        _log.info("started yieldgate serve (pid %d) at %s", server.pid, live.url)
        with stop.watching(watched):
            yield Live(live, pid=server.pid, scrape=config.scrape or auto)


@contextlib.contextmanager
def _live_target(config: BurstConfig, target: Target) -> Iterator[tuple[Target, Any]]:
    """A started server (``config.serve_args``): the target at its address, and its handle."""
    # Here, not at the top: the server runs in a child process, and importing
    # yieldgate.burst loads no server module.
    from yieldgate.server import spawn

    assert config.serve_args is not None
    # In a session of its own: a Ctrl-C at the terminal reaches the tool alone, which
    # ends the run and then stops the server itself (SIGTERM), in order.
    with spawn(
        "--grace-s",
        "0",
        *config.serve_args,
        http=target.is_http,
        ready_timeout=config.ready_timeout_s,
        new_session=True,
    ) as server:
        address = server.http_address if target.is_http else None
        yield target.at(*(address or (server.host, server.port))), server


def run_async(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        options: dict[str, Any] = {}
    else:
        options = {"use_uvloop": True}
    return anyio.run(fn, *args, backend="asyncio", backend_options=options)


async def wait_ready(stats: StatsSource, timeout_s: float) -> None:
    """Until the server says it is warm (``cold`` false); at once if it has no counters."""
    with anyio.fail_after(timeout_s):
        while True:
            counters = await stats()
            if counters is None or not counters.get("cold", False):
                return
            await anyio.sleep(0.1)


async def run_one(
    config: BurstConfig,
    strategy: Strategy,
    live: Live,
    offsets: Sequence[float],
    prompts: Sequence[str],
    run_index: int,
    progress: Progress,
    share: Share | None = None,
    stop: Stop | None = None,
) -> Any:
    """Send ``strategy``'s requests and summarise them (a worker: hand them to ``share``).
    ``stop`` cuts the run short: what is in flight then is cancelled, what was not sent
    is not, both counted as ``interrupted``, and the result is marked incomplete."""
    target = live.target
    stop = stop or Stop()
    log = AttemptLog()
    gate = strategy.make_gate(log)
    requests = [Request(index=i, arrival_s=offset) for i, offset in enumerate(offsets)]
    for request, entry in zip(requests, config.profile.entries, strict=False):
        request.max_tokens = entry.max_tokens
    priorities: dict[int, str] = {}
    if config.priority_mix:
        drawn = draw_priorities(config.priority_mix, len(requests), config.seed)
        for request, priority in zip(requests, drawn, strict=True):
            request.priority = priority
            priorities[request.index] = priority
    if share is not None:
        requests = [requests[i] for i in share.indices]
        prompts = [prompts[i] for i in share.indices]
    timeline: list[TimelinePoint] = []
    finished = {"ok": 0, "failed": 0}
    probes: list[Probe] | None = None if config.recovery_probe_s is None else []
    async with contextlib.AsyncExitStack() as stack:
        send, stats = await stack.enter_async_context(
            open_target(
                target,
                gate,
                dataclasses.replace(config.workload, timeout_s=config.timeout_s),
                dialect=config.dialect,
                native_retries=strategy.native_retries(target.kind),
            )
        )
        send = strategy.wrap(send, target.kind, seed=config.seed + run_index)
        scrape = None
        if live.scrape is not None:
            scrape = await stack.enter_async_context(_scraper(live.scrape))
        probe = None
        if probes is not None:
            probe = await stack.enter_async_context(_prober(config, target))
        if config.wait_ready:
            await wait_ready(stats, config.ready_timeout_s)
        baseline: list[tuple[float, float, bool]] = []
        if probe is not None:
            for _ in range(config.baseline_probes):
                baseline.append(await probe())
        if scrape is not None:
            await scrape()  # once before the clock starts: the first render costs the most
        # A worker's server counters are read by its parent, once around all workers.
        before = await stats() if share is None else None
        t0 = time.monotonic() if share is None else await share.start()
        log.t0 = t0
        log.records.clear()
        if probes is not None:
            probes.extend(Probe(sent_s=a - t0, end_s=b - t0, clean=ok) for a, b, ok in baseline)

        async def sample() -> None:
            # A point is stamped when it is taken: the client's figures are read then, and
            # the server's stats and metrics are asked for together at once, so a busy loop
            # delays their replies but neither shifts the point nor splits its two reads.
            t_s = time.monotonic() - t0
            g = gate.statistics()
            ok, failed = finished["ok"], finished["failed"]
            rss = None if live.pid is None else process_rss_bytes(live.pid)
            reads: dict[str, Any] = {}

            async def read(name: str, source: Callable[[], Awaitable[Any]]) -> None:
                reads[name] = await source()

            async with anyio.create_task_group() as tg:
                if before is not None:
                    tg.start_soon(read, "counters", stats)
                if scrape is not None:
                    tg.start_soon(read, "series", scrape)
            counters, series = reads.get("counters"), reads.get("series")
            timeline.append(
                TimelinePoint(
                    t_s=t_s,
                    client_inflight=g.window.inflight,
                    client_attempts=g.attempts,
                    client_yields=g.yields + g.overloads,
                    completed=ok,
                    failed=failed,
                    server_inflight=None if counters is None else counters["inflight"],
                    server_executed=None
                    if counters is None or before is None
                    else counters["executed_total"] - before["executed_total"],
                    server_yielded=None
                    if counters is None or before is None
                    else counters["yielded_total"] - before["yielded_total"],
                    scraped_queue=None if series is None else series.queue,
                    scraped_running=None if series is None else series.running,
                    scraped_kv_cache=None if series is None else series.kv_cache,
                    server_rss_bytes=rss,
                )
            )

        async def sampler(done: anyio.Event) -> None:
            while not done.is_set():
                await sample()
                with anyio.move_on_after(config.sample_interval_s):
                    await done.wait()

        reported: set[str] = set()

        async def one(request: Request, prompt: str) -> None:
            # Open loop: one task per request, sent at its arrival.
            request.origin = t0
            await anyio.sleep_until(t0 + request.arrival_s)
            await attempt(request, prompt)

        async def closed_loop(queue: Iterator[tuple[Request, str]]) -> None:
            # One of ``concurrency`` senders: each takes the earliest request not yet
            # sent, waits for its arrival, sends it, and takes the next; as a task per
            # request waiting on a limiter would, without the task and the limiter.
            for request, prompt in queue:
                request.origin = t0
                now = time.monotonic()
                if now < t0 + request.arrival_s:
                    await anyio.sleep_until(t0 + request.arrival_s)
                    now = time.monotonic()
                request.arrival_s = now - t0
                await attempt(request, prompt)

        async def attempt(request: Request, prompt: str) -> None:
            cancelled = False
            deadline = math.inf
            try:
                if config.timeout_s is None:
                    await send(prompt, request)
                else:
                    deadline = t0 + request.arrival_s + config.timeout_s
                    with anyio.CancelScope(deadline=deadline) as scope:
                        await send(prompt, request)
                    cancelled = scope.cancelled_caught
            except Exception as exc:
                request.error = error_kind(exc)
                if request.error == UNREACHABLE:
                    request.unreachable = unreachable_line(exc, target.host, target.port)
                if request.error == "DeadlineExceededError" and time.monotonic() >= deadline:
                    # The client's time-out, given to the Gate as its deadline too: the
                    # Gate's timer fired first (the same instant, on a busy loop).
                    request.error = "timeout"
                finished["failed"] += 1
                if isinstance(exc, _BUGS) and request.error not in reported:
                    # Counted like any failure, but a bug must not hide as a statistic.
                    reported.add(request.error)
                    _log.error("request failed with a programming error", exc_info=exc)
            else:
                if cancelled:
                    request.error = "timeout"
                    finished["failed"] += 1
                else:
                    request.ok = True
                    finished["ok"] += 1
            finally:
                request.end_s = time.monotonic() - t0
                progress.advance()

        async def prober(done: anyio.Event) -> None:
            assert probe is not None
            assert probes is not None
            assert config.recovery_probe_s is not None
            last_arrival = max(offsets, default=0.0)
            while True:
                now = time.monotonic() - t0
                if now > last_arrival + config.recovery_limit_s:
                    return
                sent, ended, ok = await probe()
                probes.append(Probe(sent_s=sent - t0, end_s=ended - t0, clean=ok))
                if done.is_set() and recovery((), last_arrival, probes).latency_s is not None:
                    return
                await anyio.sleep_until(sent + config.recovery_probe_s)

        done = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(sampler, done)
            probing = anyio.Event()
            if probe is not None:

                async def probe_then_mark() -> None:
                    try:
                        await prober(done)
                    finally:
                        probing.set()

                tg.start_soon(probe_then_mark)
            else:
                probing.set()
            with anyio.CancelScope() as firing:
                tg.start_soon(_watch, stop, firing, done)
                async with anyio.create_task_group() as fire:
                    if config.concurrency is None:
                        for request, prompt in zip(requests, prompts, strict=True):
                            fire.start_soon(one, request, prompt)
                    else:
                        # In order of arrival (a stable sort: ties keep their order).
                        order = sorted(zip(requests, prompts, strict=True), key=_arrival)
                        queue = iter(order)
                        for _ in range(min(config.concurrency, len(order))):
                            fire.start_soon(closed_loop, queue)
            done.set()
            if firing.cancel_called:
                tg.cancel_scope.cancel()  # no recovery to wait for: the run ends now
            await probing.wait()
        cut_short = firing.cancel_called
        # A dead server answers nothing: its last reads may not hold up the report.
        with anyio.move_on_after(_LAST_READS_S if cut_short else math.inf):
            await sample()
        after = None
        if share is None:
            with anyio.move_on_after(_LAST_READS_S if cut_short else math.inf):
                after = await stats()
    if cut_short:
        for r in requests:
            if not r.ok and r.error is None:
                r.error = "interrupted"
    never = sum(1 for r in requests if not r.ok and r.error is None)
    if never:
        # A cancellation that escaped one request ends the whole burst; say so.
        _log.warning(
            "%s: %d of %d requests ended with neither a reply nor an error (counted as "
            "'unfinished'): a cancellation escaped a request and cut the burst short",
            strategy.label,
            never,
            len(requests),
        )
    g = gate.statistics()
    if share is not None:
        return share.collect(requests, timeline, g.attempts, g.yields + g.overloads, log.records)
    server = None
    if before is not None and after is not None:
        server = ServerCounters.between(before, after)
    cold_start_s, ramp_s = sim_ramp(config.serve_args)
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
        attempt_log=log.records,
        probes=probes,
        priorities=priorities or None,
        complete=not cut_short,
    )


async def _watch(stop: Stop, firing: anyio.CancelScope, done: anyio.Event) -> None:
    """Cancel ``firing`` once ``stop`` is set, or a process it watches has died; until
    ``done``. Polled: a signal handler or another process sets what it reads."""
    while not done.is_set():
        if stop.check():
            firing.cancel()
            return
        with anyio.move_on_after(_WATCH_S):
            await done.wait()


def _arrival(pair: tuple[Request, str]) -> float:
    return pair[0].arrival_s


@contextlib.asynccontextmanager
async def _scraper(url: str) -> AsyncIterator[Callable[[], Awaitable[Any]]]:
    """A ``scrape()`` reading ``url``'s Prometheus text into common series (``None`` on failure)."""
    import httpx

    async with httpx.AsyncClient(timeout=5.0) as client:
        warned = False

        async def scrape() -> Any:
            nonlocal warned
            try:
                response = await client.get(url)
                response.raise_for_status()
                return common_series(parse_exposition(response.text))
            except (httpx.HTTPError, ValueError) as exc:
                if not warned:
                    warned = True
                    _log.warning("scraping %s failed: %s", url, exc)
                return None

        yield scrape


@contextlib.asynccontextmanager
async def _prober(
    config: BurstConfig, target: Target
) -> AsyncIterator[Callable[[], Awaitable[tuple[float, float, bool]]]]:
    """A ``probe()`` sending one lone request through a pass-through Gate of its own:
    ``(sent, ended, succeeded)`` in ``time.monotonic()`` seconds."""
    gate = Strategy(name="naive").make_gate()
    async with open_target(target, gate, config.workload, dialect=config.dialect) as (send, _):
        count = 0

        async def probe() -> tuple[float, float, bool]:
            nonlocal count
            count += 1
            request = Request(index=-count, arrival_s=0.0)
            request.origin = time.monotonic()
            sent = time.monotonic()
            try:
                with anyio.fail_after(max(config.recovery_limit_s, 1.0)):
                    await send(f"probe {count}", request)
            except Exception:  # a refused or failed probe is the measurement
                return sent, time.monotonic(), False
            return sent, time.monotonic(), True

        yield probe
