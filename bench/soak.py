"""Soak: three times the server's capacity for minutes; do memory and descriptors stay flat?

What it does. Starts ``yieldgate serve --max-inflight 8 --exec-ms 20`` (a
fresh process) and runs ``--factor`` x 8 client tasks that submit in a
closed loop through one ``GovernedClient`` and its Gate (the default policy)
for ``--duration`` seconds (120 by default). Every ``--sample-s`` seconds
it samples the RSS and the open file descriptors of the server process and
of this client process (from ``/proc``) and the server's counters.

Reported: calls that succeeded, that gave up (a ``YieldgateError``: the
Gate's deadline or budget ran out), and any other error, by type; the
server's yields; RSS and descriptors at the start (after a warm-up) and at
the end, and their growth. Goal: flat (growth within noise) and no error
that is not a yield.

Run it (from the repository root)::

    .venv/bin/python bench/soak.py
    .venv/bin/python bench/soak.py --duration 30 --factor 3

Linux only (it reads ``/proc``). The exit status is 1 when any call failed
with something other than a ``YieldgateError``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import anyio

import yieldgate
from _common import add_smoke_flag, smoke
from yieldgate.server import spawn

MAX_INFLIGHT = 8


@dataclass(slots=True)
class Sample:
    t: float
    server_rss_kib: int
    server_fds: int
    client_rss_kib: int
    client_fds: int
    executed: int
    yielded: int


@dataclass(slots=True)
class Tally:
    ok: int = 0
    gave_up: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def soak(args: argparse.Namespace, server_pid: int, url: str) -> tuple[list[Sample], Tally]:
    tally = Tally()
    samples: list[Sample] = []
    me = os.getpid()
    async with yieldgate.GovernedClient(url) as client:

        async def sample(t: float) -> None:
            stats = await client.stats()
            samples.append(
                Sample(
                    t=t,
                    server_rss_kib=rss_kib(server_pid),
                    server_fds=fds(server_pid),
                    client_rss_kib=rss_kib(me),
                    client_fds=fds(me),
                    executed=stats["executed_total"],
                    yielded=stats["yielded_total"],
                )
            )

        async def caller(stop_at: float) -> None:
            n = 0
            while time.monotonic() < stop_at:
                n += 1
                try:
                    await client.submit(f"soak {n}")
                    tally.ok += 1
                except yieldgate.YieldgateError as exc:
                    tally.gave_up[type(exc).__name__] += 1
                except Exception as exc:
                    tally.errors[type(exc).__name__] += 1

        started = time.monotonic()
        warm_until = started + args.warmup
        stop_at = warm_until + args.duration
        async with anyio.create_task_group() as tg:
            for _ in range(args.factor * MAX_INFLIGHT):
                tg.start_soon(caller, stop_at)
            await anyio.sleep(args.warmup)
            next_sample = time.monotonic()
            while time.monotonic() < stop_at:
                await sample(time.monotonic() - warm_until)
                next_sample += args.sample_s
                await anyio.sleep(max(0.0, min(next_sample, stop_at) - time.monotonic()))
        await sample(time.monotonic() - warm_until)
    return samples, tally


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--duration", type=float, default=120.0, help="seconds measured")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds before the first sample")
    parser.add_argument("--factor", type=int, default=3, help="client tasks per server slot")
    parser.add_argument("--sample-s", type=float, default=10.0)
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    if smoke(args):
        args.duration, args.warmup, args.factor, args.sample_s = 2.0, 0.5, 1, 1.0

    with spawn("--max-inflight", str(MAX_INFLIGHT), "--exec-ms", "20", "--grace-s", "0") as server:
        samples, tally = anyio.run(soak, args, server.pid, server.url)
    first, last = samples[0], samples[-1]
    calls = tally.ok + sum(tally.gave_up.values()) + sum(tally.errors.values())
    print(
        f"soak: {args.duration:.0f} s at {args.factor}x capacity "
        f"({args.factor * MAX_INFLIGHT} callers, {MAX_INFLIGHT} slots, 20 ms each)"
    )
    print(f"{'t s':>6} {'server RSS KiB':>15} {'fds':>5} {'client RSS KiB':>15} {'fds':>5}")
    for s in samples:
        print(
            f"{s.t:>6.0f} {s.server_rss_kib:>15,} {s.server_fds:>5} "
            f"{s.client_rss_kib:>15,} {s.client_fds:>5}"
        )
    executed = last.executed - first.executed
    yielded = last.yielded - first.yielded
    print(
        f"calls {calls:,}: ok {tally.ok:,}, gave up {dict(tally.gave_up) or 0}, "
        f"other errors {dict(tally.errors) or 0}; server executed {executed:,} and "
        f"yielded {yielded:,} while measured"
    )
    print(
        f"server RSS {first.server_rss_kib:,} -> {last.server_rss_kib:,} KiB "
        f"({last.server_rss_kib - first.server_rss_kib:+,}), fds {first.server_fds} -> "
        f"{last.server_fds}; client RSS {first.client_rss_kib:,} -> {last.client_rss_kib:,} KiB "
        f"({last.client_rss_kib - first.client_rss_kib:+,}), fds {first.client_fds} -> "
        f"{last.client_fds}"
    )
    return 1 if tally.errors else 0


if __name__ == "__main__":
    sys.exit(main())
