"""Text generation through the official HuggingFace client, under a Gate, across a cold start.

``huggingface_hub``'s ``AsyncInferenceClient`` takes its HTTP client from a
factory: ``yieldgate.huggingface_clients(gate)`` installs, for a ``with``
block, one whose requests pass through a Gate with the
``huggingface`` dialect, which reads the ``estimated_time`` of a model that is
still loading (503) as a cold-start hint. No official client does: they fail
or retry blind. Against yieldgate's reference server, started cold:

    yieldgate serve --max-inflight 4 --exec-ms 200 --cold-start-s 2 --ramp-s 3 \\
        --http-port 8000 &
    python examples/huggingface_text.py --url http://127.0.0.1:8000/models/tiny --requests 40

every call succeeds: the Gate waits out the loading model and then the ramp.
Pass ``--stream`` to stream tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from huggingface_hub import AsyncInferenceClient

import yieldgate


async def one(client: AsyncInferenceClient, n: int, stream: bool) -> str:
    prompt = f"Once upon a time, caller {n}"
    if not stream:
        return await client.text_generation(prompt, max_new_tokens=32)
    tokens = await client.text_generation(prompt, max_new_tokens=32, stream=True)
    return "".join([token async for token in tokens])


async def main(url: str, requests: int, stream: bool) -> int:
    gate = yieldgate.Gate(yieldgate.GatePolicy.cold_start(max_concurrency=32), name="hf")
    started = time.perf_counter()
    # Inside the block, huggingface_hub's clients send through the Gate.
    with yieldgate.huggingface_clients(gate):
        async with AsyncInferenceClient(model=url) as client:
            results = await asyncio.gather(
                *(one(client, n, stream) for n in range(requests)), return_exceptions=True
            )
    elapsed = time.perf_counter() - started
    failed = [r for r in results if isinstance(r, BaseException)]
    stats = gate.statistics()
    print(f"{requests - len(failed)}/{requests} succeeded in {elapsed:.2f} s")
    print(
        f"attempts {stats.attempts} ({stats.attempts / requests:.2f} per call), "
        f"yields {stats.yields} (cold start and saturation), overloads {stats.overloads}"
    )
    for error in failed[:3]:
        print(f"failed: {type(error).__name__}: {error}")
    return 1 if failed else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000/models/tiny")
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--stream", action="store_true", help="stream tokens")
    args = parser.parse_args()
    raise SystemExit(asyncio.run(main(args.url, args.requests, args.stream)))
