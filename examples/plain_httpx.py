"""A burst of plain httpx requests to a TGI-style ``/generate`` endpoint, under a Gate.

Code that uses httpx directly gets an ``httpx.AsyncClient`` from
``yieldgate.http_client(gate, dialect=..., flavor="httpx")``: every request
waits for a window slot, a 429 is waited out around its ``retry-after-ms``
hint, and when the Gate gives up the last response is returned as it came,
so ``raise_for_status()`` works as usual. Against yieldgate's reference
server (4 slots), 10x more requests than slots at once:

    yieldgate serve --max-inflight 4 --exec-ms 200 --http-port 8000 &
    python examples/plain_httpx.py --url http://127.0.0.1:8000 --requests 40

``--dialect`` says how replies are read: ``tgi`` (any TGI server) or
``governed-http`` (yieldgate's server: exact hints and reasons from the body).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import httpx

import yieldgate


async def one(client: httpx.AsyncClient, n: int) -> str:
    body = {"inputs": f"Once upon a time, caller {n}", "parameters": {"max_new_tokens": 32}}
    response = await client.post("/generate", json=body)
    response.raise_for_status()
    text: str = response.json()["generated_text"]
    return text


async def server_counters(url: str) -> dict[str, Any] | None:
    """yieldgate's reference server has a /stats route; other servers may not."""
    async with httpx.AsyncClient(base_url=url) as plain:  # not through the Gate
        response = await plain.get("/stats")
    return response.json() if response.status_code == 200 else None


async def main(url: str, requests: int, dialect: str) -> int:
    gate = yieldgate.Gate(name="tgi")
    before = await server_counters(url)
    started = time.perf_counter()
    async with yieldgate.http_client(gate, dialect=dialect, flavor="httpx", base_url=url) as client:
        results = await asyncio.gather(
            *(one(client, n) for n in range(requests)), return_exceptions=True
        )
    elapsed = time.perf_counter() - started
    after = await server_counters(url)
    failed = [r for r in results if isinstance(r, BaseException)]
    stats = gate.statistics()
    print(f"{requests - len(failed)}/{requests} succeeded in {elapsed:.2f} s")
    print(
        f"attempts {stats.attempts} ({stats.attempts / requests:.2f} per request), "
        f"yields {stats.yields} (429s waited out), window now {stats.window.limit}"
    )
    if before is not None and after is not None:
        print(
            f"server: yielded {after['yielded_total'] - before['yielded_total']} meanwhile, "
            f"peak inflight {after['inflight_peak']} of {after['max_inflight']} slots (never more)"
        )
    for error in failed[:3]:
        print(f"failed: {type(error).__name__}: {error}")
    return 1 if failed else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the server's base URL")
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--dialect", choices=["tgi", "governed-http"], default="tgi")
    args = parser.parse_args()
    raise SystemExit(asyncio.run(main(args.url, args.requests, args.dialect)))
