"""``yieldgate demo``: one burst, three client strategies, against a real model server.

By default: ``yieldgate serve --backend harness --prefill-workers 1`` (the
tiny torch model, prefill disaggregated to a worker process) is started fresh
for each of ``yieldgate``, ``naive`` and ``tenacity``; each fires the same
burst of streamed requests (a quarter of them long prompts) at it; the
comparison table is printed and the plot written.

``--seed-scenario`` replays the seed instead: ``max_inflight 1``, 20 clients
submit at the same instant, execution takes 10 s: exactly one executes,
nineteen are yielded at once, ``inflight`` never passes 1. Counters are
sampled with ``stats`` and printed as they change.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
from anyio.streams.buffered import BufferedByteReceiveStream

from yieldgate._extras import require
from yieldgate.cli._common import CliError, add_log_level, check_outputs, run_async
from yieldgate.protocol import encode_frame, stats_frame, submit_frame


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "demo",
        help="one burst through yieldgate, naive and tenacity against a real model server",
        description=(
            "Start 'yieldgate serve --backend harness --prefill-workers 1' fresh for each "
            "strategy (yieldgate, naive, tenacity), fire the same burst of streamed requests, "
            "print the comparison and write the plot. With --seed-scenario: replay the seed "
            "scenario instead (max_inflight 1, N concurrent submits at once)."
        ),
    )
    burst = p.add_argument_group("the burst comparison (default)")
    burst.add_argument("--requests", type=int, default=160, help="requests per strategy")
    burst.add_argument("--max-inflight", type=int, default=8, help="the server's slots")
    burst.add_argument("--plot", type=Path, default=Path("demo-plot.png"), help="PNG to write")
    burst.add_argument("--json", type=Path, help="also write the results as JSON")
    burst.add_argument("--no-progress", action="store_true", help="no progress bar")
    seed = p.add_argument_group("the seed scenario (--seed-scenario)")
    seed.add_argument(
        "--seed-scenario", action="store_true", help="replay the seed scenario instead"
    )
    seed.add_argument("--clients", type=int, default=20, help="concurrent clients (default 20)")
    seed.add_argument(
        "--exec-ms", type=float, default=10_000.0, help="backend execution time (default 10 s)"
    )
    add_log_level(p)
    p.set_defaults(run=run)


def _burst_demo(args: argparse.Namespace) -> int:
    from yieldgate.cli import _burst

    _burst.check_extra("the demo")
    require("torch", "the demo's server (--backend harness)")
    from yieldgate.burst import BurstConfig, demo_settings

    for flag, value in (("--requests", args.requests), ("--max-inflight", args.max_inflight)):
        if value < 1:
            raise CliError(f"{flag} must be at least 1, got {value}")
    check_outputs([("--plot", args.plot), ("--json", args.json)])
    config = BurstConfig(**demo_settings(requests=args.requests, max_inflight=args.max_inflight))
    print(
        f"demo: {args.requests} streamed requests at once against `yieldgate serve "
        f"{' '.join(config.serve_args or ())}`, started fresh for each strategy",
        flush=True,
    )
    report = _burst.execute(
        config, progress=not args.no_progress, json_path=args.json, plot_path=args.plot
    )
    return 0 if all(met for _, met, _ in report.verdicts()) else 1


@dataclass
class _Run:
    t0: float = 0.0
    replies: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    peak_inflight: int = 0
    last: dict[str, Any] = field(default_factory=dict)


class _Line:
    """One NDJSON connection: write a frame, read one reply."""

    def __init__(self, stream: anyio.abc.SocketStream) -> None:
        self.stream = stream
        self.reader = BufferedByteReceiveStream(stream)

    async def ask(self, frame: dict[str, Any]) -> dict[str, Any]:
        await self.stream.send(encode_frame(frame))
        line = await self.reader.receive_until(b"\n", 1 << 20)
        reply: dict[str, Any] = json.loads(line)
        return reply


async def _scenario(host: str, port: int, clients: int, run: _Run) -> None:
    conns = [_Line(await anyio.connect_tcp(host, port)) for _ in range(clients)]
    monitor = _Line(await anyio.connect_tcp(host, port))
    go = anyio.Event()

    async def client(i: int, line: _Line) -> None:
        await go.wait()
        reply = await line.ask(submit_frame(f"req-{i}", f"prompt {i}"))
        run.replies.append((time.monotonic() - run.t0, reply))

    def show(stats: dict[str, Any]) -> None:
        keys = ("inflight", "executed_total", "yielded_total")
        print(f"t={time.monotonic() - run.t0:6.2f}s  " + "  ".join(f"{k}={stats[k]}" for k in keys))

    async def sample(stop: anyio.Event) -> None:
        n = 0
        while not stop.is_set():
            stats = await monitor.ask(stats_frame(f"stats-{n}"))
            n += 1
            run.peak_inflight = max(run.peak_inflight, stats["inflight"])
            view = {k: stats[k] for k in ("inflight", "executed_total", "yielded_total")}
            if view != run.last:
                show(stats)
                run.last = view
            with anyio.move_on_after(0.05):
                await stop.wait()

    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(sample, stop)
        async with anyio.create_task_group() as fire:
            for i, line in enumerate(conns):
                fire.start_soon(client, i, line)
            run.t0 = time.monotonic()
            go.set()
        stop.set()
    final = await monitor.ask(stats_frame("final"))
    run.peak_inflight = max(run.peak_inflight, final["inflight"])
    show(final)
    run.last = final
    for line in [*conns, monitor]:
        await line.stream.aclose()


def run(args: argparse.Namespace) -> int:
    if not args.seed_scenario:
        return _burst_demo(args)
    if args.clients < 2:
        raise CliError("--clients must be at least 2")
    print(
        f"seed scenario: max_inflight=1, {args.clients} concurrent clients, "
        f"execution {args.exec_ms / 1000:.1f} s"
    )
    from yieldgate.server import ServerStartError, spawn

    run = _Run()
    flags = ("--max-inflight", "1", "--exec-ms", str(args.exec_ms), "--grace-s", "1")
    try:
        server = spawn(*flags, capture_stderr=False)  # its log goes to this terminal
    except ServerStartError as exc:
        raise CliError(str(exc)) from None
    with server:
        run_async(_scenario, server.host, server.port, args.clients, run)
    yields = [t for t, r in run.replies if r["status"] == "yield"]
    oks = [t for t, r in run.replies if r["status"] == "ok"]
    final = run.last
    print()
    print(
        f"executed: {len(oks)}   yielded: {len(yields)}   peak inflight seen: {run.peak_inflight}"
    )
    if yields:
        print(f"every yield arrived within {max(yields) * 1000:.1f} ms of the burst")
    print(
        f"final counters: executed_total={final['executed_total']} "
        f"yielded_total={final['yielded_total']} inflight={final['inflight']}"
    )
    expected = (
        len(oks) == 1
        and len(yields) == args.clients - 1
        and final["executed_total"] == 1
        and final["yielded_total"] == args.clients - 1
        and final["inflight"] == 0
        and run.peak_inflight <= 1
    )
    print("seed scenario reproduced" if expected else "seed scenario NOT reproduced")
    return 0 if expected else 1
