"""A burst of messages through Anthropic's official client, under a Gate.

The client is anthropic's own, unmodified: only its ``http_client`` comes from
yieldgate, and its own retries are off (``max_retries=0``) because the Gate does
the retrying, with a window, hints, jitter and a budget. Against yieldgate's
reference server (4 slots here, its Messages route) every call succeeds
although 10x more are sent at once:

    yieldgate serve --max-inflight 4 --exec-ms 200 --http-port 8000 &
    python examples/anthropic_messages.py --base-url http://127.0.0.1:8000 --requests 40

Pass ``--stream`` to stream the answers (``client.messages.stream``); the window
slot of a streamed call is held until its stream ends. For Anthropic's API,
leave ``--base-url`` out and set ANTHROPIC_API_KEY.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

import anthropic
from anthropic.types import MessageParam

import yieldgate


async def one(client: anthropic.AsyncAnthropic, model: str, n: int, stream: bool) -> str:
    messages: list[MessageParam] = [{"role": "user", "content": f"Say hello to caller {n}."}]
    if not stream:
        message = await client.messages.create(model=model, max_tokens=32, messages=messages)
        return "".join(block.text for block in message.content if block.type == "text")
    async with client.messages.stream(model=model, max_tokens=32, messages=messages) as answer:
        return "".join([text async for text in answer.text_stream])


async def main(base_url: str | None, model: str, requests: int, stream: bool) -> int:
    # One Gate per upstream, shared by every call to it.
    gate = yieldgate.Gate(yieldgate.GatePolicy.cold_start(max_concurrency=32), name="anthropic")
    # anthropic's own client, its HTTP client the Gate's and its own retries off.
    client = yieldgate.anthropic_client(
        gate,
        base_url=base_url,
        api_key=os.environ.get("ANTHROPIC_API_KEY", "not-needed-locally"),
    )
    started = time.perf_counter()
    async with client:
        results = await asyncio.gather(
            *(one(client, model, n, stream) for n in range(requests)), return_exceptions=True
        )
    elapsed = time.perf_counter() - started
    failed = [r for r in results if isinstance(r, BaseException)]
    stats = gate.statistics()
    print(f"{requests - len(failed)}/{requests} succeeded in {elapsed:.2f} s")
    print(
        f"attempts {stats.attempts} ({stats.attempts / requests:.2f} per call), "
        f"overloads {stats.overloads}, yields {stats.yields}, window {stats.window.limit}"
    )
    for error in failed[:3]:
        print(f"failed: {type(error).__name__}: {error}")
    return 1 if failed else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default=None, help="default: Anthropic's API")
    parser.add_argument("--model", default="claude-sonnet-4-5")
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--stream", action="store_true", help="stream the answers")
    args = parser.parse_args()
    raise SystemExit(asyncio.run(main(args.base_url, args.model, args.requests, args.stream)))
