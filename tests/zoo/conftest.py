"""The zoo runs on virtual time (asyncio's ``VirtualTimeLoop``), as the Gate tests do: a
minute's quota costs no minute, and every Gate it builds holds nothing afterwards.

The official clients hop to a thread once per client (``asyncio.to_thread`` for
their platform headers). Under virtual time a hop is a hazard: while the thread
runs, the loop sees nothing ready and jumps to its next timer, and on a busy
machine a whole quota window passes in the hop. The loop's default executor
here runs such work inline instead.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest

from tests.gate.conftest import _nothing_held_after_the_test
from tests.vtime import VirtualTimeLoop, gates_read_the_loop_clock

__all__ = ["_nothing_held_after_the_test"]


class _Inline(ThreadPoolExecutor):
    """Runs each function at once, in the caller's thread."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        done: Future[Any] = Future()
        try:
            done.set_result(fn(*args, **kwargs))
        except BaseException as exc:
            done.set_exception(exc)
        return done


def _loop() -> VirtualTimeLoop:
    loop = VirtualTimeLoop()
    loop.set_default_executor(_Inline(max_workers=1))
    return loop


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return ("asyncio", {"loop_factory": _loop})


@pytest.fixture(autouse=True)
def _loop_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    gates_read_the_loop_clock(monkeypatch)
