"""Benchmark: the governed server's yield path against a bare NDJSON echo, same run.

What it measures. ``yieldgate serve`` is started with one slot
(``--max-inflight 1 --exec-ms 600000``) and that slot is occupied by one long
submit on a connection of its own, so every further submit is answered
``yield`` at once: the path a saturated server takes for nearly every request.
N client connections (default 1,000) each run a closed loop: send one
pre-encoded submit frame, wait for the reply line, record the latency. Every
reply must be that connection's ``"status":"yield"``; anything else counts as
an error. The same load is then run against ``bench/_echo_server.py``, a bare
NDJSON echo on the same stack (anyio on asyncio with uvloop) with the same read
strategy, minus JSON, hashing and governance. Each target gets a fresh server
process, a warm-up, then a measured window. The figure that matters is the
ratio of replies/s, governor over echo, measured in the same run on the same
machine (goal: >= 0.70).

Server and client CPU use over the measured window are printed too: when the
client is pinned at 100% it, not the server, sets the pace, and the ratio
flatters the server. So is the CPU that everything else on the machine used
meanwhile ("other cpu", Linux only): on a machine with few cores a neighbour's
build or test run moves the ratio by more than most changes do, so a run with
more than a few percent there is a run to repeat.

Run it (from the repository root)::

    .venv/bin/python bench/governor.py
    .venv/bin/python bench/governor.py --connections 1000 --duration 5 --rounds 3 \\
        --json bench-governor.json

All traffic stays on 127.0.0.1. The exit status is 1 when any reply was wrong
or any connection broke, else 0 (whatever the ratio).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import resource
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from _common import add_smoke_flag, smoke
from yieldgate._stats import percentile
from yieldgate.protocol import encode_frame, submit_frame
from yieldgate.server import ServerProcess, spawn

HOST = "127.0.0.1"
ECHO = "echo"
GOVERNOR = "governor"
GOAL_RATIO = 0.70
_READ_SIZE = 65536
_READY_TIMEOUT_S = 30.0
_CONNECT_BATCH = 100
_CONNECT_ATTEMPTS = 5
_NOISY_OTHER_CPU_PCT = 5.0
_BROKEN = (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream, OSError)

ReplyCheck = Callable[[bytes], bool]


@dataclass(slots=True)
class Tally:
    """What one target's measured window produced."""

    latencies_s: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    error_sample: str | None = None

    def error(self, kind: str, detail: str) -> None:
        self.errors[kind] += 1
        if self.error_sample is None:
            self.error_sample = detail[:200]


@dataclass(frozen=True, slots=True, kw_only=True)
class RunResult:
    """One target, one round."""

    target: str
    round: int
    replies: int
    window_s: float
    p50_ms: float
    p99_ms: float
    errors: int
    errors_by_kind: dict[str, int]
    error_sample: str | None
    server_cpu_pct: float | None
    client_cpu_pct: float
    other_cpu_pct: float | None
    latencies_s: list[float] = field(repr=False)  # sorted; pooled across rounds, not written

    @property
    def replies_per_s(self) -> float:
        return self.replies / self.window_s if self.window_s > 0 else 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Summary:
    """One target over every round: replies summed, latencies pooled."""

    target: str
    replies_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int
    server_cpu_pct: float | None
    client_cpu_pct: float
    other_cpu_pct: float | None

    @property
    def server_us_per_reply(self) -> float | None:
        """Server CPU time per reply: unlike replies/s, not capped by a busy client."""
        if self.server_cpu_pct is None or not self.replies_per_s:
            return None
        return self.server_cpu_pct / 100 / self.replies_per_s * 1e6


def percentile_ms(seconds: Sequence[float], p: float) -> float:
    """The nearest-rank ``p``-th percentile of ``seconds``, in milliseconds (NaN if none)."""
    return percentile(seconds, p, default=math.nan) * 1000.0


def machine_busy_seconds() -> float | None:
    """CPU seconds every process on the machine has used since boot (Linux only)."""
    try:
        with open("/proc/stat") as stat:
            ticks = [int(v) for v in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = ticks[3] + ticks[4]  # idle, iowait
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


# One slot, held by a long submit: every other submit is yielded at once.
GOVERNOR_ARGS = ("--max-inflight", "1", "--exec-ms", "600000", "--grace-s", "0")


def echo_program() -> list[str]:
    return [sys.executable, str(Path(__file__).with_name("_echo_server.py"))]


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds process ``pid`` has used (Linux only)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def running_server(target: str) -> Iterator[ServerProcess]:
    """A fresh server for ``target``, always stopped on the way out; its stderr told on failure."""
    if target == GOVERNOR:
        server = spawn(*GOVERNOR_ARGS, ready_timeout=_READY_TIMEOUT_S)
    else:
        server = spawn(program=echo_program(), ready_timeout=_READY_TIMEOUT_S)
    with server:
        try:
            yield server
        except Exception:
            print(f"server stderr:\n{server.stderr[-2000:]}", file=sys.stderr)
            raise


def client_frames(connections: int, body: str) -> list[bytes]:
    """One pre-encoded submit per connection; each keeps its id (one request in flight)."""
    return [encode_frame(submit_frame(f"c{i}", body)) for i in range(connections)]


def echo_check(frame: bytes) -> ReplyCheck:
    expected = frame[:-1]
    return lambda line: line == expected


def yield_check(frame: bytes) -> ReplyCheck:
    rid = json.loads(frame)["id"]
    prefix = json.dumps({"id": rid, "status": "yield"}, separators=(",", ":"))[:-1].encode()
    return lambda line: line.startswith(prefix)


async def connect(port: int) -> anyio.abc.SocketStream:
    """Connect to 127.0.0.1:``port``, retrying a few times if the backlog overflows."""
    for attempt in range(1, _CONNECT_ATTEMPTS + 1):
        try:
            return await anyio.connect_tcp(HOST, port)
        except OSError:
            if attempt == _CONNECT_ATTEMPTS:
                raise
            await anyio.sleep(0.05 * attempt)
    raise AssertionError("unreachable")


async def connect_all(port: int, count: int) -> list[anyio.abc.SocketStream]:
    """Open ``count`` connections, ``_CONNECT_BATCH`` at a time."""
    streams: list[anyio.abc.SocketStream] = []

    async def one() -> None:
        streams.append(await connect(port))

    try:
        for first in range(0, count, _CONNECT_BATCH):
            async with anyio.create_task_group() as tg:
                for _ in range(first, min(count, first + _CONNECT_BATCH)):
                    tg.start_soon(one)
    except BaseException:
        await close_all(streams)
        raise
    return streams


async def close_all(streams: Sequence[anyio.abc.SocketStream]) -> None:
    with anyio.CancelScope(shield=True):
        for stream in streams:
            with contextlib.suppress(Exception):
                await stream.aclose()


async def read_line(stream: anyio.abc.SocketStream, buf: bytearray) -> bytes:
    """The next line of ``stream`` without its newline; the rest stays in ``buf``."""
    while (nl := buf.find(b"\n")) < 0:
        buf += await stream.receive(_READ_SIZE)
    line = bytes(buf[:nl])
    del buf[: nl + 1]
    return line


@dataclass(slots=True)
class Window:
    """Whether replies arriving now are counted."""

    measuring: bool = False


async def closed_loop(
    stream: anyio.abc.SocketStream, frame: bytes, check: ReplyCheck, window: Window, tally: Tally
) -> None:
    """Send ``frame``, await its reply, record it; repeat until cancelled."""
    buf = bytearray()
    clock = time.perf_counter
    latencies = tally.latencies_s
    while True:
        sent = clock()
        try:
            await stream.send(frame)
            line = await read_line(stream, buf)
        except _BROKEN as exc:
            tally.error("connection", repr(exc))
            return
        if window.measuring:
            latencies.append(clock() - sent)
            if not check(line):
                tally.error("reply", line.decode("utf-8", "replace"))


async def occupy_slot(port: int, body: str) -> anyio.abc.SocketStream:
    """Take the server's only slot with one long submit; return its connection.

    A probe on the same connection must then be answered ``yield``: lines of one
    connection are handled in order, so the long submit was admitted first.
    """
    stream = await connect(port)
    try:
        await stream.send(encode_frame(submit_frame("occupy", body)))
        probe = encode_frame(submit_frame("probe", body))
        await stream.send(probe)
        with anyio.fail_after(_READY_TIMEOUT_S):
            reply = await read_line(stream, bytearray())
        if not yield_check(probe)(reply):
            raise RuntimeError(f"slot not occupied: probe was answered {reply!r}")
    except BaseException:
        await close_all([stream])
        raise
    return stream


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadSpec:
    connections: int
    warmup_s: float
    duration_s: float
    body: str


async def measure(target: str, round_no: int, server: ServerProcess, spec: LoadSpec) -> RunResult:
    """Drive ``server`` with the closed-loop load; return the measured window."""
    frames = client_frames(spec.connections, spec.body)
    make_check = yield_check if target == GOVERNOR else echo_check
    holders: list[anyio.abc.SocketStream] = []
    streams: list[anyio.abc.SocketStream] = []
    tally, window = Tally(), Window()
    try:
        if target == GOVERNOR:
            holders.append(await occupy_slot(server.port, spec.body))
        streams = await connect_all(server.port, spec.connections)
        async with anyio.create_task_group() as tg:
            for stream, frame in zip(streams, frames, strict=True):
                tg.start_soon(closed_loop, stream, frame, make_check(frame), window, tally)
            await anyio.sleep(spec.warmup_s)
            cpu0, client0, t0 = cpu_seconds(server.pid), time.process_time(), time.perf_counter()
            busy0 = machine_busy_seconds()
            window.measuring = True
            await anyio.sleep(spec.duration_s)
            window.measuring = False
            cpu1, client1, t1 = cpu_seconds(server.pid), time.process_time(), time.perf_counter()
            busy1 = machine_busy_seconds()
            tg.cancel_scope.cancel()
    finally:
        await close_all(streams + holders)
    elapsed = t1 - t0
    server_cpu = None if cpu0 is None or cpu1 is None else 100.0 * (cpu1 - cpu0) / elapsed
    client_cpu = 100.0 * (client1 - client0) / elapsed
    other_cpu = None
    if busy0 is not None and busy1 is not None and server_cpu is not None:
        # Clock ticks are coarse: a quiet machine can read a little below zero.
        other_cpu = max(0.0, 100.0 * (busy1 - busy0) / elapsed - server_cpu - client_cpu)
    latencies = sorted(tally.latencies_s)
    return RunResult(
        target=target,
        round=round_no,
        replies=len(latencies),
        window_s=elapsed,
        p50_ms=percentile_ms(latencies, 50),
        p99_ms=percentile_ms(latencies, 99),
        errors=sum(tally.errors.values()),
        errors_by_kind=dict(tally.errors),
        error_sample=tally.error_sample,
        server_cpu_pct=server_cpu,
        client_cpu_pct=client_cpu,
        other_cpu_pct=other_cpu,
        latencies_s=latencies,
    )


def run_target(target: str, round_no: int, spec: LoadSpec) -> RunResult:
    """Start a fresh server for ``target``, measure it, and always kill it."""
    with running_server(target) as server:
        return anyio.run(
            measure,
            target,
            round_no,
            server,
            spec,
            backend="asyncio",
            backend_options={"use_uvloop": True},
        )


def summarise(target: str, results: Sequence[RunResult], pooled_s: Sequence[float]) -> Summary:
    window = sum(r.window_s for r in results)
    cpus = [r.server_cpu_pct for r in results]
    others = [r.other_cpu_pct for r in results]
    return Summary(
        target=target,
        replies_per_s=sum(r.replies for r in results) / window,
        p50_ms=percentile_ms(pooled_s, 50),
        p99_ms=percentile_ms(pooled_s, 99),
        errors=sum(r.errors for r in results),
        server_cpu_pct=None if None in cpus else sum(c or 0.0 for c in cpus) / len(cpus),
        client_cpu_pct=sum(r.client_cpu_pct for r in results) / len(results),
        other_cpu_pct=None if None in others else sum(o or 0.0 for o in others) / len(others),
    )


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}%"


def _us(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def format_table(rows: Sequence[Summary]) -> str:
    head = (
        f"{'target':<10} {'replies/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7}"
        f" {'server cpu':>10} {'client cpu':>10} {'server us/reply':>16} {'other cpu':>9}"
    )
    lines = [head, "-" * len(head)]
    for row in rows:
        lines.append(
            f"{row.target:<10} {row.replies_per_s:>10,.0f} {row.p50_ms:>8.2f} {row.p99_ms:>8.2f}"
            f" {row.errors:>7} {_pct(row.server_cpu_pct):>10} {_pct(row.client_cpu_pct):>10}"
            f" {_us(row.server_us_per_reply):>16} {_pct(row.other_cpu_pct):>9}"
        )
    return "\n".join(lines)


def ratio_of(echo: Summary, gov: Summary) -> float:
    return gov.replies_per_s / echo.replies_per_s if echo.replies_per_s else math.nan


def write_json(
    path: Path,
    args: argparse.Namespace,
    summaries: dict[str, Summary],
    runs: list[RunResult],
    ratio: float,
) -> None:
    doc: dict[str, Any] = {
        "benchmark": "bench/governor.py",
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "arch": platform.machine(),
        },
        "params": {
            "connections": args.connections,
            "warmup_s": args.warmup,
            "duration_s": args.duration,
            "rounds": args.rounds,
            "body_bytes": args.body_bytes,
        },
        "summary": {name: _as_dict(s) for name, s in summaries.items()},
        "runs": [_as_dict(r) | {"replies_per_s": r.replies_per_s} for r in runs],
        "ratio_governor_over_echo": ratio,
        "goal_ratio": GOAL_RATIO,
    }
    path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")


def _as_dict(obj: Summary | RunResult) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in fields(obj) if f.name != "latencies_s"}


def raise_nofile_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit (servers inherit it); return it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Governed server's yield path vs a bare NDJSON echo, side by side."
    )
    p.add_argument("--connections", type=int, default=1000, help="concurrent connections")
    p.add_argument("--warmup", type=float, default=1.0, help="warm-up seconds per target")
    p.add_argument("--duration", type=float, default=5.0, help="measured seconds per target")
    p.add_argument("--rounds", type=int, default=1, help="rounds; the order alternates")
    p.add_argument("--body-bytes", type=int, default=64, help="size of each submit's body")
    p.add_argument("--json", type=Path, metavar="PATH", help="also write the figures here")
    add_smoke_flag(p)
    args = p.parse_args(argv)
    if smoke(args):
        args.connections, args.warmup, args.duration, args.rounds = 20, 0.2, 0.5, 1
    if args.connections < 1 or args.rounds < 1 or args.duration <= 0 or args.warmup < 0:
        p.error("need --connections >= 1, --rounds >= 1, --duration > 0, --warmup >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    nofile = raise_nofile_limit()
    if nofile < args.connections + 64:
        print(f"RLIMIT_NOFILE is {nofile}: too low for {args.connections} connections")
        return 2
    spec = LoadSpec(
        connections=args.connections,
        warmup_s=args.warmup,
        duration_s=args.duration,
        body="x" * args.body_bytes,
    )
    runs: list[RunResult] = []
    for round_no in range(1, args.rounds + 1):
        order = (ECHO, GOVERNOR) if round_no % 2 else (GOVERNOR, ECHO)
        for target in order:
            result = run_target(target, round_no, spec)
            runs.append(result)
            print(f"round {round_no} {target}: {result.replies_per_s:,.0f} replies/s", flush=True)
    return report(args, runs)


def report(args: argparse.Namespace, runs: list[RunResult]) -> int:
    summaries: dict[str, Summary] = {}
    for target in (ECHO, GOVERNOR):
        mine = [r for r in runs if r.target == target]
        pooled = sorted(lat for r in mine for lat in r.latencies_s)
        summaries[target] = summarise(target, mine, pooled)
    ratio = ratio_of(summaries[ECHO], summaries[GOVERNOR])
    print()
    print(
        f"{args.connections} connections, {args.warmup:g} s warm-up, {args.duration:g} s measured,"
        f" {args.rounds} round(s), {os.cpu_count()} CPUs"
    )
    print(format_table(list(summaries.values())))
    for r in runs:
        if r.errors:
            print(f"{r.target} round {r.round} errors {r.errors_by_kind}: {r.error_sample}")
    noisy = [r for r in runs if (r.other_cpu_pct or 0.0) > _NOISY_OTHER_CPU_PCT]
    if noisy:
        worst = max(r.other_cpu_pct or 0.0 for r in noisy)
        print(
            f"warning: other processes used up to {worst:.0f}% CPU during {len(noisy)} of"
            f" {len(runs)} measured windows; the ratio is unreliable, run it again"
        )
    print(f"ratio governor/echo (replies/s): {ratio:.2f} (goal >= {GOAL_RATIO:.2f})")
    echo_us = summaries[ECHO].server_us_per_reply
    gov_us = summaries[GOVERNOR].server_us_per_reply
    if echo_us and gov_us:
        print(f"ratio echo/governor (server CPU per reply): {echo_us / gov_us:.2f}")
    if args.json is not None:
        write_json(args.json, args, summaries, runs, ratio)
        print(f"wrote {args.json}")
    return 1 if any(r.errors for r in runs) else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted; servers stopped", file=sys.stderr)
        sys.exit(130)
