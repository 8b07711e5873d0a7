"""Benchmark: every provider of the zoo, a default Gate against the official client's defaults.

For each provider of ``tests/zoo/providers.py`` (a fake written from the provider's
documentation: its buckets, its headers, its 429s), the same burst, ``--calls`` chat
completions of mixed sizes fired at once, half again the provider's binding quota,
through the provider's official async client (``AsyncOpenAI``; ``AsyncAnthropic``
for Anthropic):

- ``gate``: on ``yieldgate.http_client(Gate())``, configured with nothing (the
  client's own retries off, as ``yieldgate.openai_client`` sets them);
- ``official``: the client as its docs set it up, its own retries
  (``max_retries=2``: backoff from 0.5 s, ``retry-after`` honoured up to 60 s).

Per provider and client: the 429s the provider sent, the calls that succeeded,
and the makespan over the quota's bound (what is past the binding bucket's first
fill, at its refill rate; calls that failed end the burst sooner, so read it with
the success column). Virtual time (asyncio's ``VirtualTimeLoop``, the tests'):
a minute's quota costs no minute and the numbers do not depend on the machine.
Rounds differ by the burst's seed; each cell is the median, with the range.

Run it (from the repository root)::

    .venv/bin/python bench/providers.py
    .venv/bin/python bench/providers.py --rounds 5 --calls 120 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

import anyio  # noqa: E402
import httpx2  # noqa: E402

import yieldgate  # noqa: E402
import yieldgate.gate._gate  # noqa: E402
from _common import add_smoke_flag, smoke  # noqa: E402
from tests.vtime import VirtualTimeLoop  # noqa: E402
from tests.zoo.burst import bound_s, fire, jobs, official, zoo  # noqa: E402
from tests.zoo.conftest import _loop  # noqa: E402
from tests.zoo.providers import Fake, quotas, specs  # noqa: E402

STRATEGIES = ("gate", "official")


async def run(name: str, strategy: str, calls: int, seed: int) -> dict[str, Any]:
    burst = jobs(calls, seed)
    (spec,) = [s for s in zoo(burst) if s.name == name]
    fake = Fake(spec, anyio.current_time, httpx2)
    inner = httpx2.MockTransport(fake.handle)
    gate = None
    if strategy == "gate":
        gate = yieldgate.Gate(name=f"bench-{name}")
        http_client = yieldgate.http_client(gate, dialect=spec.dialect, inner=inner)
        client = official(spec, http_client, max_retries=0)
    else:
        client = official(spec, httpx2.AsyncClient(transport=inner))
    errors, makespan = await fire(spec, client, burst)
    await client.close()
    if gate is not None:
        await gate.aclose()
    return {
        "provider": name,
        "strategy": strategy,
        "seed": seed,
        "calls": calls,
        "ok": calls - len(errors),
        "refused": fake.refused,
        "makespan_s": makespan,
        "bound_s": bound_s(spec, burst),
    }


def one_run(name: str, strategy: str, calls: int, seed: int) -> dict[str, Any]:
    result: dict[str, Any] = anyio.run(
        run, name, strategy, calls, seed, backend_options={"loop_factory": _loop}
    )
    return result


def _cell(values: list[float], fmt: str) -> str:
    mid = statistics.median(values)
    lo, hi = min(values), max(values)
    return format(mid, fmt) if lo == hi else f"{mid:{fmt}} ({lo:{fmt}}-{hi:{fmt}})"


def table(results: list[dict[str, Any]]) -> str:
    names = list(dict.fromkeys(r["provider"] for r in results))
    head = "| provider | " + " | ".join(
        f"{s} 429s | {s} success | {s} makespan / bound" for s in STRATEGIES
    )
    rows = [head + " |", "|---" * (1 + 3 * len(STRATEGIES)) + "|"]
    for name in names:
        cells = [name]
        for strategy in STRATEGIES:
            mine = [r for r in results if r["provider"] == name and r["strategy"] == strategy]
            cells.append(_cell([r["refused"] for r in mine], ".0f"))
            cells.append(_cell([100 * r["ok"] / r["calls"] for r in mine], ".0f") + "%")
            cells.append(_cell([r["makespan_s"] / r["bound_s"] for r in mine], ".2f"))
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", nargs="*", help="providers to run (default: all)")
    parser.add_argument("--json", type=Path, help="write every run's numbers here")
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    if smoke(args):
        args.calls, args.rounds = 10, 1
    # Gates read the loop's (virtual) clock, as in the tests.
    yieldgate.gate._gate.default_clock = anyio.current_time  # type: ignore[attr-defined]
    names = args.only or [s.name for s in specs(quotas([(1, 1)]))]
    results = []
    for round_ in range(args.rounds):  # interleaved: every provider and client each round
        for name in names:
            for strategy in STRATEGIES:
                results.append(one_run(name, strategy, args.calls, seed=100 + round_))
    print(table(results))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    assert VirtualTimeLoop  # the loop the runs use (through ``_loop``)
    raise SystemExit(main())
