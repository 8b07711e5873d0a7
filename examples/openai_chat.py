"""A burst of chat completions through the official OpenAI client, under a Gate.

The client is used unmodified: only its ``http_client`` comes from yieldgate,
and its own retries are turned off (``max_retries=0``) because the Gate does
the retrying, with a window, hints, jitter and a budget. Against yieldgate's
reference server (which has 4 slots here) every call succeeds although 10x
more are sent at once:

    yieldgate serve --max-inflight 4 --exec-ms 200 --http-port 8000 &
    python examples/openai_chat.py --base-url http://127.0.0.1:8000/v1 --requests 40

Pass ``--stream`` to stream the answers; the window slot of a streamed call
is held until its stream ends. For api.openai.com, pass its URL and set
OPENAI_API_KEY.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

import openai
from openai.types.chat import ChatCompletionMessageParam

import yieldgate


async def one(client: openai.AsyncOpenAI, n: int, stream: bool) -> str:
    messages: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": f"Say hello to caller {n}."}
    ]
    if not stream:
        reply = await client.chat.completions.create(
            model="yieldgate-sim",
            messages=messages,
            max_tokens=32,
        )
        return reply.choices[0].message.content or ""
    pieces = []
    chunks = await client.chat.completions.create(
        model="yieldgate-sim",
        messages=messages,
        max_tokens=32,
        stream=True,
    )
    async for chunk in chunks:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
    return "".join(pieces)


async def main(base_url: str, requests: int, stream: bool) -> int:
    # One Gate per upstream, shared by every call to it.
    gate = yieldgate.Gate(yieldgate.GatePolicy.cold_start(max_concurrency=32), name="chat")
    # openai's own client, its HTTP client the Gate's and its own retries off.
    client = yieldgate.openai_client(
        gate, base_url=base_url, api_key=os.environ.get("OPENAI_API_KEY", "not-needed-locally")
    )
    started = time.perf_counter()
    async with client:
        results = await asyncio.gather(
            *(one(client, n, stream) for n in range(requests)), return_exceptions=True
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
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--stream", action="store_true", help="stream the answers")
    args = parser.parse_args()
    raise SystemExit(asyncio.run(main(args.base_url, args.requests, args.stream)))
