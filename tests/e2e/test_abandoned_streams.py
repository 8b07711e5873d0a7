"""Streams users abandon, through the official clients, give their slots back at once.

A user closes the page, an agent stops at the first tool call: the stream is
left after a chunk, unclosed. openai's ``Stream`` and ``AsyncStream`` keep
themselves alive in a reference cycle (the generator that reads them refers
back to them), so such a stream lives until the garbage collector looks at
the generation its cycle is in; a stream read for a while has been promoted
to the oldest one, which a large process collects rarely. Until then its
window slot stayed taken, up to the attempt's time (60 s by default).

Each shape (sync and async; openai and anthropic; left by ``break``, by
``del`` after ``next``, each in a thread or task of its own, or in a list
that is cleared) runs in a process of its own, as a user's application does
(``tests/e2e/abandoning.py``: its heap is the clients' and yieldgate's, with
nothing frozen or arranged): it abandons 8 streams on one Gate of window 8
against ``yieldgate serve``, each after its first chunk and after a
collection that promoted it (while still referenced) to the oldest
generation, as a while of reading does. The ninth call must start within 1 s
of being made. A stream read slowly (seconds per chunk) keeps its slot while
another call waits and the waiter collects: the waiter starts only once the
stream is closed. ``audit()`` is clean after each.
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.e2e.abandoning import PROMPT, WINDOW, Sdk, gate_of
from tests.fleet.member import member_env
from tests.gate.holdings import held
from yieldgate.gate import _dropped
from yieldgate.server import ServerProcess, spawn

pytestmark = pytest.mark.e2e

WITHIN_S = 1.0


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with spawn("--max-inflight", "64", "--exec-ms", "20", http=True) as proc:
        yield proc


def http_url(server: ServerProcess) -> str:
    assert server.http_url is not None
    return server.http_url


SHAPES = [
    pytest.param(sdk, how, mode, id=f"{mode}-{sdk}-{how}")
    for mode in ("sync", "async")
    for sdk in ("openai", "anthropic")
    for how in ("break", "del", "list")
]


@pytest.mark.parametrize(("sdk_name", "how", "mode"), SHAPES)
def test_streams_left_after_a_chunk_give_their_slots_back(
    server: ServerProcess, sdk_name: str, how: str, mode: str
) -> None:
    script = Path(__file__).with_name("abandoning.py")
    proc = subprocess.run(
        [sys.executable, str(script), http_url(server), sdk_name, how, mode],
        capture_output=True,
        text=True,
        timeout=120,
        env=member_env(),
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    took = got["took_s"]
    assert got["failed"] is None, f"the ninth call failed after {took:.2f} s: {got['failed']}"
    assert took < WITHIN_S, f"the ninth call started {took:.2f} s after it was made"
    assert got["held"] == []
    assert got["inflight"] == 0


@pytest.fixture
def collector(monkeypatch: pytest.MonkeyPatch) -> _dropped.Collector:
    """The collections made for waiters in this test alone (to count them)."""
    fresh = _dropped.Collector()
    monkeypatch.setattr(_dropped, "COLLECTOR", fresh)
    return fresh


# -- read slowly: the slot stays ---------------------------------------------------------------

# Three chunks, sent at once; the reader takes READ_S over each.
SLOW = {"backend_params": {"exec_ms": 30, "chunks": 3}}
READ_S = 1.0


def test_a_stream_read_slowly_keeps_its_slot_while_a_waiter_collects(
    server: ServerProcess, collector: _dropped.Collector
) -> None:
    gate, starts = gate_of(1, total_s=30.0)
    sdk = Sdk("openai", gate, http_url(server), sync=True)
    create = sdk.client.chat.completions.create
    stream = create(model="m", messages=PROMPT, stream=True, extra_body=SLOW)
    chunks = 0
    waiter_made = threading.Event()
    reply: list[Any] = []

    def wait_for_the_slot() -> None:
        waiter_made.set()
        reply.append(sdk.short())

    waiter = threading.Thread(target=wait_for_the_slot)
    read = 0.0
    for _ in stream:
        chunks += 1
        if chunks == 1:
            waiter.start()
            assert waiter_made.wait(10)
        time.sleep(READ_S)  # a reader that takes seconds over each chunk
        read = time.monotonic()
    waiter.join(30)
    assert not waiter.is_alive()
    assert chunks >= 3, "the slow stream was cut short"
    assert len(reply) == 1
    assert collector.runs[2] > 0, "the waiter never collected the whole heap"
    # The waiter's attempt began only once the reader was done with the stream.
    assert starts.starts[-1] >= read
    assert held(gate) == []
    sdk.client.close()


@pytest.mark.anyio
async def test_an_async_stream_read_slowly_keeps_its_slot_while_a_waiter_collects(
    server: ServerProcess, collector: _dropped.Collector
) -> None:
    gate, starts = gate_of(1, total_s=30.0)
    sdk = Sdk("openai", gate, http_url(server), sync=False)
    create = sdk.client.chat.completions.create
    stream = await create(model="m", messages=PROMPT, stream=True, extra_body=SLOW)
    chunks = 0
    read = 0.0
    reply: list[Any] = []

    async def wait_for_the_slot() -> None:
        reply.append(await sdk.short())

    async with anyio.create_task_group() as tg:
        async for _ in stream:
            chunks += 1
            if chunks == 1:
                tg.start_soon(wait_for_the_slot)
            await anyio.sleep(READ_S)  # a reader that takes seconds over each chunk
            read = time.monotonic()
    assert chunks >= 3, "the slow stream was cut short"
    assert len(reply) == 1
    assert collector.runs[2] > 0, "the waiter never collected the whole heap"
    assert starts.starts[-1] >= read
    assert held(gate) == []
    await sdk.client.close()


# -- collected inside the Gate's own code -----------------------------------------------------


def test_a_stream_collected_while_its_thread_holds_the_gates_lock_does_not_deadlock(
    server: ServerProcess,
) -> None:
    """An automatic collection may start at any allocation, inside the Gate's critical
    sections too; the dropped stream's generator then closes its response there."""
    gate, _ = gate_of(WINDOW, total_s=5.0)
    sdk = Sdk("openai", gate, http_url(server), sync=True)
    stream = sdk.stream()
    next(stream)
    gc.collect()
    del stream
    done = threading.Event()

    def collect_under_the_lock() -> None:
        with gate._core.lock:
            gc.collect()
        done.set()

    collector = threading.Thread(target=collect_under_the_lock, daemon=True)
    collector.start()
    assert done.wait(10), "deadlocked: the collected stream waited for the Gate's lock"
    gate._core.tend()  # as the next caller that looks would
    assert held(gate) == []
    assert gate.statistics().window.inflight == 0
    sdk.client.close()
