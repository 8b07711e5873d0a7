"""Helpers shared by the subcommands."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio

T = TypeVar("T")


class CliError(Exception):
    """A problem with what the user asked for, reported as one line, exit status 2."""


def run_async(fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """Run ``fn`` on asyncio, with uvloop when it is installed."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        options: dict[str, Any] = {}
    else:
        options = {"use_uvloop": True}
    return anyio.run(fn, *args, backend="asyncio", backend_options=options)
