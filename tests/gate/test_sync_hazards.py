"""Issue 28, the sync world: what threads, event loops, Ctrl-C, fork and the garbage
collector do to a Gate's calls.

Regression tests written before the fix, one per bug: ``gate.wrap`` on async
callables it took for sync ones, ``map_sync`` that neither stopped at its first
failure nor at Ctrl-C, ``call_sync`` blocking the event loop it was called from, a
forked child inheriting its parent's window slots, and a dropped sync stream that
kept its slot until a garbage collection nobody ran.

The Gates here read ``time.monotonic`` (the sync driver blocks threads for real);
the async tests still run under tests/gate/conftest.py's virtual-time loops.
"""

from __future__ import annotations

import _thread
import gc
import inspect
import os
import select
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import anyio
import pytest

import yieldgate
from tests.gate.holdings import held
from yieldgate import CallFailedError, Gate, GatePolicy, TimeoutPolicy, WindowPolicy
from yieldgate.gate import NullInstrumentation
from yieldgate.server import ServerProcess


def gate(**policy: Any) -> Gate:
    return Gate(
        GatePolicy(**policy),
        name="sync-hazards",
        instrumentation=NullInstrumentation(),
        clock=time.monotonic,
    )


def wait_until(check: Callable[[], bool], timeout: float) -> bool:
    """Poll ``check`` until it holds or ``timeout`` passes (real time); whether it held."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


# -- 11. gate.wrap on async callables ------------------------------------------------------


@pytest.mark.anyio
async def test_wrap_governs_an_object_whose_call_is_a_coroutine_function() -> None:
    """Bug 11: gate.wrap treated an object with an ``async def __call__`` as sync: the
    coroutine came back from call_sync and ran with no window slot held during it."""

    class Model:
        running = 0
        peak = 0

        async def __call__(self, prompt: str) -> str:
            self.running += 1
            self.peak = max(self.peak, self.running)
            try:
                await anyio.sleep(1.0)
            finally:
                self.running -= 1
            return prompt.upper()

    g = Gate(GatePolicy(window=WindowPolicy.fixed(1)), instrumentation=NullInstrumentation())
    model = Model()
    generate = g.wrap(model)
    results: dict[str, str] = {}

    async def one(prompt: str) -> None:
        results[prompt] = await generate(prompt)

    async with anyio.create_task_group() as tg:
        tg.start_soon(one, "a")
        tg.start_soon(one, "b")
    assert results == {"a": "A", "b": "B"}
    assert model.peak == 1, "a window of one let two generations run at once"
    assert g.statistics().attempts == 2
    assert held(g) == []


def test_wrap_refuses_a_plain_function_that_returns_a_coroutine() -> None:
    """Bug 11: gate.wrap on a plain function returning a coroutine (a lambda around an
    async client) handed the coroutine back ungoverned instead of raising TypeError."""

    async def generate() -> str:
        return "text"

    g = gate()
    wrapped = g.wrap(lambda: generate())
    try:
        result = wrapped()
    except TypeError:
        pass
    else:
        if inspect.iscoroutine(result):
            result.close()
        pytest.fail(f"the wrapper returned {result!r} instead of raising TypeError")
    assert held(g) == []


# -- 12. map_sync: the first failure and Ctrl-C --------------------------------------------


def test_map_sync_starts_no_item_after_the_first_failure() -> None:
    """Bug 12: map_sync went on starting items after one had failed (it only looked at
    the failures in input order, behind a slow first item), as its docstring says it won't."""
    g = gate()
    started: list[int] = []
    failed = threading.Event()

    def work(i: int) -> int:
        started.append(i)
        if i == 0:
            failed.wait(10)
            time.sleep(0.5)  # still running well after item 1 failed
        elif i == 1:
            failed.set()
            raise ValueError("item 1 is bad")
        return i

    with pytest.raises(CallFailedError) as info:
        g.map_sync(work, range(20), concurrency=2)
    assert isinstance(info.value.__cause__, ValueError)
    assert sorted(started) == [0, 1], f"started after the failure: {sorted(started)[2:]}"
    assert held(g) == []


def test_ctrl_c_stops_map_sync_promptly_and_starts_nothing_more() -> None:
    """Bug 12: map_sync ignored Ctrl-C until the whole batch had run (the KeyboardInterrupt
    came out of the thread pool's shutdown, after every queued item)."""
    g = gate()
    started: list[int] = []
    ended: list[int] = []

    def work(i: int) -> int:
        started.append(i)
        time.sleep(1.0)
        ended.append(i)
        return i

    # 20 items of 1 s on 2 threads: 10 s for the batch. Ctrl-C comes at 0.3 s, and again
    # every 0.5 s until map_sync has raised: a KeyboardInterrupt that CPython delivers
    # while the main thread runs a finalizer (a collection it triggered) is lost, as a
    # user's Ctrl-C then is, and the user presses it again.
    raised = threading.Event()

    def press() -> None:
        if not raised.wait(0.3):
            _thread.interrupt_main()
            while not raised.wait(0.5):
                _thread.interrupt_main()

    ctrl_c = threading.Thread(target=press)
    # Python's own Ctrl-C handler, as in a script (whatever an earlier test left).
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    begun = time.monotonic()
    ctrl_c.start()
    took: float | None = None
    try:
        try:
            g.map_sync(work, range(20), concurrency=2)
        except KeyboardInterrupt:
            took = time.monotonic() - begun
        while True:  # no more presses; one already on its way is taken here
            try:
                raised.set()
                ctrl_c.join(5)
                for _ in range(1000):
                    time.sleep(0)
                break
            except KeyboardInterrupt:
                continue
    finally:
        raised.set()
        ctrl_c.join(5)
        signal.signal(signal.SIGINT, before)
    # The items in flight may finish; nothing else may start, then or later.
    assert wait_until(lambda: len(ended) == len(started), timeout=15)
    time.sleep(0.3)
    assert took is not None, "map_sync did not raise KeyboardInterrupt"
    assert took < 3.0, f"map_sync raised KeyboardInterrupt {took:.1f} s after it began"
    assert sorted(started) == [0, 1], f"started after Ctrl-C: {sorted(started)[2:]}"
    assert held(g) == []


# -- 13. call_sync on an event loop's thread -----------------------------------------------


@pytest.mark.anyio
async def test_call_sync_on_an_event_loop_refuses_to_block_it() -> None:
    """Bug 13: call_sync from a thread that runs an event loop, with the window full of
    that loop's own calls, blocked the loop (and so them) silently until its deadline."""
    g = gate(window=WindowPolicy.fixed(1))
    holding, release = anyio.Event(), anyio.Event()

    async def answer() -> str:
        return "async"

    async def holder() -> None:
        async with g.hold(answer):
            holding.set()
            await release.wait()

    error: Exception | None = None
    async with anyio.create_task_group() as tg:
        tg.start_soon(holder)
        await holding.wait()
        begun = time.monotonic()
        try:
            g.call_sync(lambda: "sync", timeout=0.5)
        except Exception as exc:
            error = exc
        blocked = time.monotonic() - begun
        release.set()
    assert blocked < 0.25, f"call_sync blocked the event loop {blocked:.2f} s ({error!r})"
    from yieldgate import BlockingCallError  # new in issue 28: only this test needs it

    assert isinstance(error, BlockingCallError), error
    assert isinstance(error, yieldgate.YieldgateError)
    assert isinstance(error, RuntimeError)
    assert held(g) == []


@pytest.mark.anyio
async def test_sync_calls_on_an_event_loop_proceed_when_allowed() -> None:
    """Bug 13: ``allow_event_loop=True`` is how a caller says it knows it blocks its loop:
    a sync call that finds a free slot then proceeds."""
    g = gate(window=WindowPolicy.fixed(1))
    assert g.call_sync(lambda: "call", allow_event_loop=True) == "call"
    with g.hold_sync(lambda: "hold", allow_event_loop=True) as value:
        assert value == "hold"
    value, lease = g.call_and_hold_sync(lambda: "lease", allow_event_loop=True)
    lease.release()
    assert value == "lease"
    assert g.map_sync(str, [1, 2], allow_event_loop=True) == ["1", "2"]
    assert held(g) == []


# -- 14. fork --------------------------------------------------------------------------------


def _reap(pid: int, timeout: float) -> int:
    """The child's exit code; killed (and -9) if it has not ended within ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _read_all(fd: int, timeout: float) -> str:
    data = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            data += chunk
    return data.decode(errors="replace")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
def test_a_child_forked_during_calls_starts_with_a_clean_gate() -> None:
    """Bug 14: a child forked (gunicorn --preload, Celery prefork) while the parent's
    threads were mid-call inherited their window slots for good."""
    g = gate(window=WindowPolicy.fixed(1))
    entered, release = threading.Event(), threading.Event()

    def busy() -> str:
        entered.set()
        release.wait(30)
        return "parent"

    worker = threading.Thread(target=g.call_sync, args=(busy,), daemon=True)
    worker.start()
    try:
        assert entered.wait(10)
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: reports by the pipe and its exit code, never returns
            code = 1
            try:
                os.close(read_end)
                inflight = g.statistics().window.inflight
                try:
                    value = g.call_sync(lambda: "child", timeout=3)
                except BaseException as exc:
                    value = repr(exc)
                if inflight == 0 and value == "child":
                    code = 0
                os.write(write_end, f"inflight={inflight}, call -> {value}".encode())
            finally:
                os._exit(code)
        os.close(write_end)
        try:
            code = _reap(pid, timeout=30)
            report = _read_all(read_end, timeout=1)
        finally:
            os.close(read_end)
    finally:
        release.set()
        worker.join(10)
    assert code == 0, f"in the child: {report or 'no report'} (exit code {code})"


# -- 15. a sync stream dropped without closing it -----------------------------------------


@pytest.mark.e2e
def test_a_sync_stream_left_and_dropped_gives_its_slot_back_without_a_collection(
    serve: Callable[..., ServerProcess],
) -> None:
    """Bug 15: a sync openai stream left with ``break`` and dropped kept its window slot
    until two full garbage collections, so the next call in that thread timed out."""
    server = serve("--max-inflight", "4", "--exec-ms", "20", "--http-port", "0")
    policy = GatePolicy(
        window=WindowPolicy.fixed(1), timeout=TimeoutPolicy(attempt_s=5, total_s=20)
    )
    g = Gate(policy, name="openai", clock=time.monotonic)
    client = yieldgate.openai_client(
        g, sync=True, base_url=f"{server.http_url}/v1", api_key="unused"
    )
    messages: Any = [{"role": "user", "content": "tell me a long story"}]
    collecting = gc.isenabled()
    gc.disable()  # no collection happens meanwhile, as in a thread blocked on the window
    try:
        stream = client.chat.completions.create(
            model="yieldgate-sim", messages=messages, stream=True
        )
        for _chunk in stream:
            break
        del stream, _chunk
        begun = time.monotonic()
        try:
            reply = client.chat.completions.create(model="yieldgate-sim", messages=messages)
        except Exception as exc:
            reply = exc
        took = time.monotonic() - begun
    finally:
        if collecting:
            gc.enable()
        client.close()
    assert not isinstance(reply, Exception), f"the next call failed after {took:.1f} s: {reply!r}"
    assert reply.choices[0].message.content
    assert held(g) == []
