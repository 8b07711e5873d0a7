"""Many concurrent streams over the governed protocol, through one Gate.

``yieldgate.GovernedClient`` speaks the governed protocol (NDJSON over TCP)
over one multiplexed connection. Every call goes through its Gate: a ``yield``
before the first chunk narrows the window and is retried around the server's
hint; once a chunk has arrived the stream is committed (a failure then is
raised, since a retry would repeat output). The window slot is held until the
stream ends. Against yieldgate's reference server, 4 slots, 50 streams:

    yieldgate serve --port 7070 --max-inflight 4 --exec-ms 400 &
    python examples/governed_stream.py --url tcp://127.0.0.1:7070 --streams 50

TTFT here is what the caller sees: from the call to its first chunk, waits
on yields included.
"""

from __future__ import annotations

import argparse
import time

import anyio

import yieldgate
from yieldgate.burst import Percentiles


async def one(client: yieldgate.GovernedClient, n: int, ttfts: list[float]) -> int:
    started = time.perf_counter()
    pieces: list[str] = []
    async with client.stream(f"stream {n} says hello", params={"max_tokens": 16}) as chunks:
        async for data in chunks:
            if not pieces:
                ttfts.append(time.perf_counter() - started)
            pieces.append(data.get("text", "") if isinstance(data, dict) else str(data))
    return len(pieces)


async def main(url: str, streams: int) -> int:
    gate = yieldgate.Gate(yieldgate.GatePolicy(), name="governed")
    ttfts: list[float] = []
    chunk_counts: list[int] = []
    errors: list[BaseException] = []

    async def run(client: yieldgate.GovernedClient, n: int) -> None:
        try:
            chunk_counts.append(await one(client, n, ttfts))
        except yieldgate.YieldgateError as exc:
            errors.append(exc)

    async with yieldgate.GovernedClient(url, gate=gate) as client:
        before = await client.stats()  # the server's counters; not through the Gate
        started = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for n in range(streams):
                tg.start_soon(run, client, n)
        elapsed = time.perf_counter() - started
        after = await client.stats()

    stats = gate.statistics()
    print(f"{len(chunk_counts)}/{streams} streams completed in {elapsed:.2f} s")
    if ttfts:
        ttft = Percentiles.of(ttfts)  # nearest rank: each one a TTFT measured
        print(
            f"chunks {sum(chunk_counts)}, TTFT p50 {ttft.p50:.3f} s, "
            f"p95 {ttft.p95:.3f} s, max {max(ttfts):.3f} s"
        )
    print(
        f"attempts {stats.attempts} ({stats.attempts / streams:.2f} per stream), "
        f"yields {stats.yields}, window now {stats.window.limit}"
    )
    print(
        f"server: yielded {after['yielded_total'] - before['yielded_total']} meanwhile, "
        f"peak inflight {after['inflight_peak']} of {after['max_inflight']} slots (never more)"
    )
    for error in errors[:3]:
        print(f"failed: {type(error).__name__}: {error}")
    return 1 if errors else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="tcp://127.0.0.1:7070", help="the governed server")
    parser.add_argument("--streams", type=int, default=50, help="concurrent streams")
    args = parser.parse_args()
    raise SystemExit(anyio.run(main, args.url, args.streams))
