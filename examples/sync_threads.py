"""Threads through the official SYNC clients, under one Gate: the Flask / Celery / script case.

Most code that calls an LLM endpoint is synchronous. Here a pool of threads
calls ``openai.OpenAI`` and ``huggingface_hub.InferenceClient`` (both used
unmodified) through ONE Gate, which the threads share: one window, one retry
budget, one breaker, one set of hint holds. Against yieldgate's reference
server with 4 slots, 40 threads at once all succeed, and the server never
runs more than 4:

    yieldgate serve --max-inflight 4 --exec-ms 100 --http-port 8000 &
    python examples/sync_threads.py --url http://127.0.0.1:8000 --threads 40
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from huggingface_hub import InferenceClient

import yieldgate


def main(url: str, threads: int) -> int:
    gate = yieldgate.Gate(name="sync-threads")  # one Gate per upstream, shared by every thread
    chat = yieldgate.openai_client(gate, sync=True, base_url=f"{url}/v1", api_key="unused")
    hf = InferenceClient(model=f"{url}/models/tiny")

    def one(n: int) -> str:
        if n % 2:
            reply = chat.chat.completions.create(
                model="yieldgate-sim", messages=[{"role": "user", "content": f"hi {n}"}]
            )
            return reply.choices[0].message.content or ""
        return hf.text_generation(f"Once upon a time, thread {n}", max_new_tokens=16)

    started = time.perf_counter()
    # Inside the block, huggingface_hub's clients send through the Gate too.
    with yieldgate.huggingface_clients(gate), chat, ThreadPoolExecutor(threads) as pool:
        futures = [pool.submit(one, n) for n in range(threads)]
        errors = [f.exception() for f in futures if f.exception() is not None]
    elapsed = time.perf_counter() - started
    stats = gate.statistics()
    with urllib.request.urlopen(f"{url}/stats", timeout=10) as response:  # noqa: S310 - our server
        server = json.load(response)
    print(f"{threads - len(errors)}/{threads} succeeded in {elapsed:.2f} s")
    print(
        f"attempts {stats.attempts} ({stats.attempts / threads:.2f} per call), "
        f"yields {stats.yields}, window {stats.window.limit}"
    )
    print(f"server: peak inflight {server['inflight_peak']} of {server['max_inflight']}")
    for error in errors[:3]:
        print(f"failed: {type(error).__name__}: {error}")
    return 1 if errors else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--threads", type=int, default=40)
    args = parser.parse_args()
    raise SystemExit(main(args.url, args.threads))
