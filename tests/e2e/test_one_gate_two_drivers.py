"""One Gate under the official sync and async clients at once, against a real server.

32 threads call through the sync ``openai.OpenAI`` and the sync
``huggingface_hub.InferenceClient`` while 32 coroutines call through
``openai.AsyncOpenAI``, all sharing ONE Gate, against the reference server's
HTTP front with 4 slots. Every call must succeed, the server must never run
more than 4 at once, and the shared window must keep the attempts per
request low: the threads and the tasks learn the server's capacity together
instead of each finding it by being refused.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from huggingface_hub import InferenceClient

import yieldgate
from tests.conftest import http_stats
from yieldgate import Gate, GatePolicy, RetryPolicy
from yieldgate.server import ServerProcess, spawn

pytestmark = pytest.mark.e2e

THREADS = 32
TASKS = 32
LIMIT_S = 120.0


@pytest.fixture
def server() -> Iterator[ServerProcess]:
    with spawn("--max-inflight", "4", "--exec-ms", "50", http=True) as proc:
        yield proc


def test_threads_and_tasks_on_one_gate_share_four_slots(server: ServerProcess) -> None:
    gate = Gate(GatePolicy(retry=RetryPolicy(max_yields=1000)), name="shared")
    messages: Any = [{"role": "user", "content": "hello"}]
    results: dict[str, list[str]] = {"openai-sync": [], "hf-sync": [], "openai-async": []}
    errors: list[BaseException] = []
    lock = threading.Lock()
    start = threading.Barrier(THREADS + 1)

    sync_openai = yieldgate.openai_client(
        gate, sync=True, base_url=f"{server.http_url}/v1", api_key="unused"
    )
    hf = InferenceClient(model=f"{server.http_url}/models/tiny")

    def thread_call(i: int) -> None:
        try:
            start.wait(LIMIT_S)
            if i % 2:
                reply = sync_openai.chat.completions.create(model="m", messages=messages)
                text, kind = reply.choices[0].message.content or "", "openai-sync"
            else:
                text, kind = hf.text_generation(f"hf {i}", max_new_tokens=4), "hf-sync"
            with lock:
                results[kind].append(text)
        except BaseException as exc:
            with lock:
                errors.append(exc)

    async def tasks() -> None:
        client = yieldgate.openai_client(gate, base_url=f"{server.http_url}/v1", api_key="unused")
        async with client:

            async def one() -> None:
                reply = await client.chat.completions.create(model="m", messages=messages)
                results["openai-async"].append(reply.choices[0].message.content or "")

            await asyncio.gather(*(one() for _ in range(TASKS)))

    with yieldgate.huggingface_clients(gate), sync_openai:
        threads = [threading.Thread(target=thread_call, args=(i,)) for i in range(THREADS)]
        for thread in threads:
            thread.start()
        start.wait(LIMIT_S)  # the threads go as the tasks do
        asyncio.run(tasks())
        for thread in threads:
            thread.join(LIMIT_S)
    assert not any(thread.is_alive() for thread in threads)

    assert errors == []
    assert len(results["openai-sync"]) == THREADS // 2
    assert len(results["hf-sync"]) == THREADS // 2
    assert len(results["openai-async"]) == TASKS
    assert set(results["openai-sync"]) == {"user: hello"}
    stats = http_stats(server)
    assert stats["inflight_peak"] <= 4
    gate_stats = gate.statistics()
    calls = THREADS + TASKS
    assert (gate_stats.calls, gate_stats.calls_ok) == (calls, calls)
    assert gate_stats.attempts / calls <= 1.5, gate_stats
    assert (gate_stats.window.inflight, gate_stats.window.waiting) == (0, 0)
