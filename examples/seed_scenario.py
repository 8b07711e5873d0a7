"""The seed experiment: one slot, 20 clients at the same instant, 10 s of execution.

Run it as is: it starts ``yieldgate serve --port 0 --max-inflight 1`` itself
(printing the address) and stops it at the end:

    python examples/seed_scenario.py                  # the seed's 10 s: about 3.5 minutes
    python examples/seed_scenario.py --exec-s 1       # the same, in about 25 s

or point it at a server you started (its own execution time then applies):

    yieldgate serve --port 7070 --max-inflight 1 --exec-ms 2000 &
    python examples/seed_scenario.py --target tcp://127.0.0.1:7070

First, 20 submits with no retries: one executes, nineteen are answered
``yield`` within milliseconds, with a hint of about the execution time, and
nothing is queued. Then 20 submits through a ``Gate``: the yields are waited
out around the hint and every call succeeds, one execution after another.
"""

from __future__ import annotations

import argparse
import time

import anyio

import yieldgate
import yieldgate.server

# Phase 1: one attempt each, all at once (no window limit, no retry on a yield).
NO_RETRY = yieldgate.GatePolicy(
    window=yieldgate.WindowPolicy.fixed(1000),
    retry=yieldgate.RetryPolicy(max_attempts=1, max_yields=0, share_hints=False),
)


async def burst(
    url: str, clients: int, policy: yieldgate.GatePolicy, timeout_s: float | None
) -> tuple[int, int]:
    """Submit ``clients`` requests at once and print what came back.

    Returns how many succeeded and the server's ``max_inflight``.
    """
    gate = yieldgate.Gate(policy, name="seed")
    replies: list[tuple[float, str]] = []  # (seconds after the burst, what came back)
    async with yieldgate.GovernedClient(url, gate=gate) as client:
        before = await client.stats()
        t0 = time.perf_counter()

        async def one(n: int) -> None:
            try:
                await client.submit(f"prompt {n}", timeout=timeout_s)
                replies.append((time.perf_counter() - t0, "ok"))
            except yieldgate.YieldExhaustedError as exc:
                replies.append((time.perf_counter() - t0, f"yield (hint {exc.last_hint_s:.2f} s)"))
            except yieldgate.YieldgateError as exc:
                replies.append((time.perf_counter() - t0, f"failed: {exc}"))

        async with anyio.create_task_group() as tg:
            for n in range(clients):
                tg.start_soon(one, n)
        after = await client.stats()
    oks = [t for t, what in replies if what == "ok"]
    yields = [(t, what) for t, what in replies if what.startswith("yield")]
    print(f"  executed {len(oks)}, last done at {max(oks, default=0):.2f} s")
    if yields:
        print(f"  yielded {len(yields)}, all within {max(t for t, _ in yields) * 1000:.0f} ms:")
        print(f"    e.g. {yields[0][1]}")
    for _, what in replies:
        if what.startswith("failed"):
            print(f"  {what}")
    stats = gate.statistics()
    print(f"  client: {stats.attempts} attempts, {stats.yields} of them yielded")
    print(
        f"  server: admitted {after['admitted_total'] - before['admitted_total']}, "
        f"yielded {after['yielded_total'] - before['yielded_total']}, "
        f"peak inflight {after['inflight_peak']} of {after['max_inflight']}, "
        f"inflight now {after['inflight']} (nothing queued)"
    )
    return len(oks), after["max_inflight"]


def start_server(exec_s: float) -> yieldgate.server.ServerProcess:
    """``yieldgate serve`` with one slot; its log is kept, and told only if it fails."""
    args = ("--max-inflight", "1", "--exec-ms", str(exec_s * 1000), "--grace-s", "0")
    try:
        server = yieldgate.server.spawn(*args)
    except yieldgate.server.ServerStartError as exc:
        raise SystemExit(f"the server did not start: {exc.stderr or exc}") from None
    command = f"yieldgate serve --max-inflight 1 --exec-ms {exec_s * 1000:g}"
    print(f"started `{command}`: listening {server.url}")
    return server


def run(url: str, clients: int) -> tuple[int, int, int]:
    """Both bursts against ``url``: successes without and with a Gate, and the server's slots."""
    print(f"\n{clients} submits at once, no retries:")
    naive_ok, slots = anyio.run(burst, url, clients, NO_RETRY, None)
    print(f"\n{clients} submits at once through a Gate (default policy):")
    # No total time limit: with one slot the last call waits for all the others.
    gate_ok, _ = anyio.run(burst, url, clients, yieldgate.GatePolicy(), None)
    return naive_ok, gate_ok, slots


def main(target: str | None, clients: int, exec_s: float) -> int:
    if target is None:
        with start_server(exec_s) as server:
            naive_ok, gate_ok, slots = run(server.url, clients)
    else:
        naive_ok, gate_ok, slots = run(target, clients)
    ok = naive_ok == min(slots, clients) and gate_ok == clients
    print("\nseed scenario reproduced" if ok else "\nseed scenario NOT reproduced")
    return 0 if ok else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", help="a governed server (default: start one)")
    parser.add_argument("--clients", type=int, default=20, help="concurrent clients (20)")
    parser.add_argument("--exec-s", type=float, default=10.0, help="execution time (10 s)")
    args = parser.parse_args()
    raise SystemExit(main(args.target, args.clients, args.exec_s))
