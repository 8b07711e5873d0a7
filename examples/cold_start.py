"""A cold start (seed 001): a burst meets a model that is still loading, then ramps up.

For ``--cold-start-s`` the server answers every request 503 "currently
loading" with ``estimated_time``, as the HuggingFace Inference API does; then
its capacity ramps from 1 slot to ``--max-inflight`` over ``--ramp-s``. The
same burst goes through ``huggingface_hub.AsyncInferenceClient`` twice, each
time against a fresh server (a cold start happens once per server):

- naive: the client as it comes; it does not retry, so every call that meets
  the loading model fails;
- yieldgate: the same client sending through a Gate with
  ``GatePolicy.cold_start()`` (one call in flight at first, patient retries).
  The ``huggingface`` dialect reads ``estimated_time`` as a hint: the Gate
  waits about that long, then its window grows with the server's capacity.

It starts the servers itself (``yieldgate serve --port 0 --http-port 0 ...``)::

    python examples/cold_start.py                      # the seed's figures, about 15 s
    python examples/cold_start.py --requests 200 --cold-start-s 5
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import httpx
from huggingface_hub import AsyncInferenceClient

import yieldgate
import yieldgate.server


def start_server(args: argparse.Namespace) -> yieldgate.server.ServerProcess:
    """``yieldgate serve`` with an HTTP front; its log is kept, and told only if it fails."""
    flags = ["--max-inflight", str(args.max_inflight), "--exec-ms", str(args.exec_ms)]
    flags += ["--cold-start-s", str(args.cold_start_s), "--ramp-s", str(args.ramp_s)]
    flags += ["--grace-s", "0"]
    try:
        return yieldgate.server.spawn(*flags, http=True)
    except yieldgate.server.ServerStartError as exc:
        raise SystemExit(f"the server did not start: {exc.stderr or exc}") from None


async def burst(url: str, requests: int) -> dict[str, Any]:
    async with AsyncInferenceClient(model=f"{url}/models/tiny") as client:
        started = time.perf_counter()
        results = await asyncio.gather(
            *(client.text_generation(f"prompt {n}", max_new_tokens=16) for n in range(requests)),
            return_exceptions=True,
        )
        elapsed = time.perf_counter() - started
    async with httpx.AsyncClient(base_url=url) as plain:
        counters: dict[str, Any] = (await plain.get("/stats")).json()
    errors = [type(r).__name__ for r in results if isinstance(r, BaseException)]
    return {"ok": requests - len(errors), "errors": errors, "s": elapsed, "server": counters}


def on_fresh_server(args: argparse.Namespace, label: str) -> int:
    """Run the burst against a server started for it; print the figures; return successes."""
    with start_server(args) as process:
        assert process.http_url is not None
        run = asyncio.run(burst(process.http_url, args.requests))
    server = run["server"]
    sent = server["admitted_total"] + server["yielded_total"]  # attempts that reached it
    print(
        f"{label}: {run['ok']}/{args.requests} succeeded in {run['s']:.2f} s, "
        f"{sent / args.requests:.2f} attempts/request"
    )
    reasons = ", ".join(f"{reason} {n}" for reason, n in server["yielded_by_reason"].items())
    failed = f"; failed: {len(run['errors'])} x {run['errors'][0]}" if run["errors"] else ""
    print(f"  server refused {server['yielded_total']} ({reasons or 'none'}){failed}")
    ok: int = run["ok"]
    return ok


def main(args: argparse.Namespace) -> int:
    print(
        f"{args.requests} requests at once; {args.cold_start_s:g} s loading, then "
        f"1 -> {args.max_inflight} slots over {args.ramp_s:g} s; {args.exec_ms:g} ms each"
    )
    on_fresh_server(args, "naive (the client as is)")
    gate = yieldgate.Gate(yieldgate.GatePolicy.cold_start(), name="hf")
    # Inside the block, huggingface_hub's clients send through the Gate.
    with yieldgate.huggingface_clients(gate):
        succeeded = on_fresh_server(args, "yieldgate (GatePolicy.cold_start())")
    return 0 if succeeded == args.requests else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--cold-start-s", type=float, default=2.0, help="loading time (2 s)")
    parser.add_argument("--ramp-s", type=float, default=5.0, help="capacity ramp (5 s)")
    parser.add_argument("--max-inflight", type=int, default=8, help="slots once warm (8)")
    parser.add_argument("--exec-ms", type=float, default=500.0, help="execution time (500 ms)")
    raise SystemExit(main(parser.parse_args()))
