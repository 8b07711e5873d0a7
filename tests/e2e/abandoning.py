"""A process that abandons streams as users do: tests/e2e/test_abandoned_streams.py runs one.

``python tests/e2e/abandoning.py SERVER_URL SDK HOW MODE``: a process whose
imports are a client application's (the official client, yieldgate), one Gate
of window 8; it opens 8 long streams through ``SDK`` (openai or anthropic),
``MODE`` (sync or async), leaves each after its first chunk as ``HOW`` says
(``break``; ``del`` after ``next``, each in a thread or task of its own; or
``list``: in a list that is cleared), then makes a ninth call and prints one
JSON line: the seconds from the ninth call being made to its attempt's start,
its error if it failed, and what the Gate still held after it.
"""

from __future__ import annotations

import contextlib
import gc
import json
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import anyio

import yieldgate
from yieldgate import Gate, GatePolicy, TimeoutPolicy, WindowPolicy
from yieldgate.gate import AttemptDetails, CallDetails, WaitDetails

WINDOW = 8
# A stream that would run 20 s: a chunk every 100 ms (the echo of the prompt, a character each).
LONG = {"backend_params": {"exec_ms": 20_000, "chunks": 200}}
PROMPT = [{"role": "user", "content": "a prompt long enough to be cut into many chunks " * 5}]


class Starts:
    """Instrumentation that notes when each attempt started, on the Gate's clock."""

    def __init__(self) -> None:
        self.starts: list[float] = []

    def start_call(self, gate: str, priority: str) -> Starts:
        return self

    def scope(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def on_attempt(self, details: AttemptDetails) -> None:
        self.starts.append(time.monotonic() - details.duration_s)

    def on_wait(self, details: WaitDetails) -> None:
        pass

    def on_end(self, details: CallDetails) -> None:
        pass

    def on_breaker_change(self, details: Any) -> None:
        pass

    def on_window_change(self, details: Any) -> None:
        pass


def gate_of(window: int, total_s: float) -> tuple[Gate, Starts]:
    starts = Starts()
    policy = GatePolicy(window=WindowPolicy.fixed(window), timeout=TimeoutPolicy(total_s=total_s))
    return Gate(name="abandoned", policy=policy, instrumentation=starts), starts


class Sdk:
    """One official client's calls: a long stream, and a short call."""

    def __init__(self, name: str, gate: Gate, url: str, sync: bool) -> None:
        if name == "openai":
            self.client = yieldgate.openai_client(
                gate, sync=sync, base_url=f"{url}/v1", api_key="unused"
            )
            create = self.client.chat.completions.create
            self.stream: Callable[[], Any] = lambda: create(
                model="m", messages=PROMPT, stream=True, extra_body=LONG
            )
            self.short: Callable[[], Any] = lambda: create(
                model="m", messages=[{"role": "user", "content": "hi"}]
            )
        else:
            self.client = yieldgate.anthropic_client(
                gate, sync=sync, base_url=url, api_key="unused"
            )
            make = self.client.messages.create
            self.stream = lambda: make(
                model="m", max_tokens=4096, messages=PROMPT, stream=True, extra_body=LONG
            )
            self.short = lambda: make(
                model="m", max_tokens=16, messages=[{"role": "user", "content": "hi"}]
            )


# -- abandoned after one chunk, in each shape ------------------------------------------------


def abandon_sync(sdk: Sdk, how: str) -> None:
    """Start 8 streams and leave each after its first chunk, as ``how`` says: in a list
    that is cleared, or each in a thread of its own (by ``break``, or ``del`` after
    ``next``). All 8 are alive through one collection first, as a while of reading
    would leave them: in the oldest generation."""
    if how == "list":
        streams = [sdk.stream() for _ in range(WINDOW)]
        for stream in streams:
            for _ in stream:
                break
        gc.collect()
        streams.clear()
        return
    read = threading.Barrier(WINDOW + 1, timeout=30)
    promoted = threading.Event()

    def leave_one() -> None:
        stream = sdk.stream()
        if how == "break":
            for _ in stream:
                read.wait()
                promoted.wait(30)
                break
        else:
            next(stream)
            read.wait()
            promoted.wait(30)
            del stream

    workers = [threading.Thread(target=leave_one) for _ in range(WINDOW)]
    for worker in workers:
        worker.start()
    read.wait()
    gc.collect()
    promoted.set()
    for worker in workers:
        worker.join(30)
        assert not worker.is_alive()


async def abandon_async(sdk: Sdk, how: str) -> None:
    """``abandon_sync`` with tasks."""
    if how == "list":
        streams = [await sdk.stream() for _ in range(WINDOW)]
        for stream in streams:
            async for _ in stream:
                break
        gc.collect()
        streams.clear()
        return
    count = [0]
    read, promoted = anyio.Event(), anyio.Event()

    async def leave_one() -> None:
        stream = await sdk.stream()
        if how == "break":
            async for _ in stream:
                count[0] += 1
                if count[0] == WINDOW:
                    read.set()
                await promoted.wait()
                break
        else:
            await anext(stream)
            count[0] += 1
            if count[0] == WINDOW:
                read.set()
            await promoted.wait()
            del stream

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            for _ in range(WINDOW):
                tg.start_soon(leave_one)
            await read.wait()
            gc.collect()
            promoted.set()


def started_within(starts: Starts, made: float, failed: BaseException | None) -> float:
    """Seconds from the ninth call being made to its attempt's start (its end if none)."""
    if failed is not None or not starts.starts:
        return time.monotonic() - made
    return starts.starts[-1] - made


def main(url: str, name: str, how: str, mode: str) -> dict[str, Any]:
    gate, starts = gate_of(WINDOW, total_s=5.0)
    sdk = Sdk(name, gate, url, sync=mode == "sync")
    failed: BaseException | None = None
    if mode == "sync":
        abandon_sync(sdk, how)
        made = time.monotonic()
        try:
            sdk.short()
        except Exception as exc:
            failed = exc
        sdk.client.close()
    else:

        async def run() -> float:
            nonlocal failed
            await abandon_async(sdk, how)
            made = time.monotonic()
            try:
                await sdk.short()
            except Exception as exc:
                failed = exc
            await sdk.client.close()
            return made

        made = anyio.run(run)
    took = started_within(starts, made, failed)
    return {
        "took_s": took,
        "failed": None if failed is None else repr(failed),
        "held": gate._core.audit(),
        "inflight": gate.statistics().window.inflight,
    }


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:5])))
