"""Issue 41: sync calls where users make them, and the wrong uses that were quiet.

A notebook cell runs on the kernel's event loop, and the plain sync clients work
there: so does a Gate's sync call (with one warning per process). Anywhere else a
sync call on a loop's thread is refused, in one line naming the call and the fix.
An ``async def`` handed to a sync call is refused before anything is taken, and a
function that returns a coroutine fails its call instead of counting as a success.

The real kernel is tests/test_notebook.py's; here IPython's shell is a stand-in
module, so that the rule itself is tested on every Python of ``make test-pythons``.
"""

from __future__ import annotations

import gc
import sys
import time
import types
import warnings
from typing import Any

import anyio
import pytest

from tests.gate.holdings import held
from yieldgate import BlockingCallError, CallFailedError, Gate, GatePolicy, WindowPolicy
from yieldgate.gate import NullInstrumentation, _gate_sync


def gate() -> Gate:
    return Gate(
        GatePolicy(window=WindowPolicy.fixed(2)),
        name="misuse",
        instrumentation=NullInstrumentation(),
        clock=time.monotonic,
    )


async def fetch() -> str:
    return "async"


@pytest.fixture
def notebook(monkeypatch: pytest.MonkeyPatch) -> None:
    """An IPython shell in this process, as a kernel has (and the warning not yet given)."""
    shell = types.ModuleType("IPython")
    shell.get_ipython = lambda: object()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "IPython", shell)
    monkeypatch.setattr(_gate_sync, "_warned_notebook", False)


@pytest.mark.anyio
async def test_a_sync_call_on_a_loop_outside_a_notebook_is_refused_in_one_line() -> None:
    g = gate()
    for call, name in (
        (lambda: g.call_sync(len, "abc"), "await gate.call(len, ...)"),
        (lambda: g.call_and_hold_sync(len, "abc"), "await gate.call_and_hold(len, ...)"),
        (lambda: g.map_sync(len, ["abc"]), "await gate.map(len, ...)"),
    ):
        with pytest.raises(BlockingCallError) as raised:
            call()
        message = str(raised.value)
        assert "\n" not in message
        assert name in message, message
        assert "worker thread" in message
    with pytest.raises(BlockingCallError) as raised, g.hold_sync(len, "abc"):
        pass
    assert "call_and_hold_sync(len)" in str(raised.value)
    assert held(g) == []
    assert g.statistics().attempts == 0


@pytest.mark.anyio
@pytest.mark.usefixtures("notebook")
async def test_a_sync_call_in_a_notebook_cell_proceeds_and_warns_once() -> None:
    g = gate()
    with pytest.warns(RuntimeWarning, match="notebook cell blocks the kernel's event loop"):
        assert g.call_sync(len, "abc") == 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning
        with g.hold_sync(len, "ab") as value:
            assert value == 2
            assert g.statistics().window.inflight == 1
        assert g.map_sync(len, ["a", "bb"]) == [1, 2]
        assert await g.call(fetch) == "async"  # the async side, beside it
    assert held(g) == []
    assert g.statistics().attempts == 5


@pytest.mark.usefixtures("notebook")
def test_a_notebook_thread_other_than_the_kernels_keeps_the_rule() -> None:
    """A worker thread of a notebook that runs a loop of its own is not the kernel's:
    a sync call there would block that loop, and is refused."""
    g = gate()
    caught: list[BaseException] = []

    async def in_a_worker_loop() -> None:
        try:
            g.call_sync(len, "abc")
        except BaseException as exc:
            caught.append(exc)

    import threading

    worker = threading.Thread(target=anyio.run, args=(in_a_worker_loop,))
    worker.start()
    worker.join()
    assert len(caught) == 1, caught
    assert isinstance(caught[0], BlockingCallError), caught


def test_an_async_function_handed_to_a_sync_call_is_refused_before_anything_is_taken() -> None:
    g = gate()
    with pytest.raises(TypeError, match=r"call_sync\(fetch\) got an async function"):
        g.call_sync(fetch)
    with pytest.raises(TypeError, match=r"call_and_hold_sync\(fetch\)"):
        g.call_and_hold_sync(fetch)
    with pytest.raises(TypeError, match=r"map_sync\(fetch\)"):
        g.map_sync(fetch, [1])
    with pytest.raises(TypeError, match=r"await gate\.call"):
        g.call_sync(g.wrap(fetch))  # wrap keeps an async callable async
    assert g.statistics().attempts == 0
    assert held(g) == []


def test_a_function_that_returns_a_coroutine_fails_its_call() -> None:
    """``call_sync(lambda: client.get(...))`` with an async client: the coroutine is
    closed (never "never awaited") and the call fails, never counted a success."""
    g = gate()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a coroutine never awaited would warn on collection
        with pytest.raises(CallFailedError) as raised:
            g.call_sync(lambda: fetch())
        gc.collect()
    cause: Any = raised.value.__cause__
    assert isinstance(cause, TypeError)
    assert "returned a coroutine (made by fetch)" in str(cause)
    stats = g.statistics()
    assert stats.attempts == 1
    assert (stats.calls_ok, stats.calls_failed) == (0, 1)
    assert held(g) == []


@pytest.mark.anyio
async def test_a_sync_clients_request_on_a_loop_is_refused_in_one_line_naming_it() -> None:
    import httpx2

    import yieldgate

    g = gate()
    inner = httpx2.MockTransport(lambda request: httpx2.Response(200, json={}))
    with (
        yieldgate.http_client(g, sync=True, inner=inner) as client,
        pytest.raises(BlockingCallError) as raised,
    ):
        client.post("http://upstream.test/v1/chat/completions", json={})
    message = str(raised.value)
    assert "\n" not in message
    assert "(POST http://upstream.test/v1/chat/completions)" in message
    assert "use the async client" in message
    assert g.statistics().attempts == 0
