"""Gate tests run on virtual time, on asyncio and on trio: no test here sleeps for real.

asyncio runs on ``VirtualTimeLoop`` (tests/vtime.py); trio on its own
``MockClock`` with ``autojump_threshold=0``, which jumps to the next deadline
whenever every task is blocked. The Gate, the window, the breaker and the rate
cap are the same code under both.
"""

from __future__ import annotations

from typing import Any

import pytest
from trio.testing import MockClock

from tests.vtime import VirtualTimeLoop, gates_read_the_loop_clock


@pytest.fixture(
    params=[
        pytest.param("asyncio", id="asyncio"),
        pytest.param("trio", id="trio"),
    ]
)
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    if request.param == "trio":
        return ("trio", {"clock": MockClock(autojump_threshold=0)})
    return ("asyncio", {"loop_factory": VirtualTimeLoop})


@pytest.fixture(autouse=True)
def _loop_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    gates_read_the_loop_clock(monkeypatch)
