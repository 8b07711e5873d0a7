"""Gate tests run on virtual time: no test here sleeps for real."""

from __future__ import annotations

from typing import Any

import pytest

from tests.vtime import VirtualTimeLoop


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return ("asyncio", {"loop_factory": VirtualTimeLoop})
