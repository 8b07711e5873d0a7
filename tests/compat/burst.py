"""A burst of calls against a real server, with the server's ``inflight`` sampled all along."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import anyio
import httpx

from yieldgate.server import ServerProcess

SLOTS = 4
CALLS = 100


class Burst:
    """What one burst did: each call's result or error, and what ``/stats`` showed."""

    def __init__(self) -> None:
        self.results: list[Any] = []
        self.inflight: list[int] = []
        self.last: dict[str, Any] = {}

    @property
    def failures(self) -> list[BaseException]:
        return [r for r in self.results if isinstance(r, BaseException)]

    def assert_all_succeeded(self) -> None:
        failures = self.failures
        assert not failures, f"{len(failures)} of {len(self.results)} failed: {failures[0]!r}"
        assert self.inflight, "the sampler saw nothing"
        assert max(self.inflight) <= SLOTS
        assert self.last["inflight_peak"] <= SLOTS  # the server's own count, between samples too
        assert self.last["inflight"] == 0


def in_thread(fn: Callable[..., Any], /, *args: Any) -> Callable[[], Awaitable[Any]]:
    """A sync call as one of a burst's: it runs in a worker thread (anyio's, up to 40 at once)."""
    return functools.partial(anyio.to_thread.run_sync, functools.partial(fn, *args))


def chain(exc: BaseException | None) -> Iterator[BaseException]:
    """``exc`` and what it was raised from, outermost first (each once: contexts can loop)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


async def burst(server: ServerProcess, calls: list[Callable[[], Awaitable[Any]]]) -> Burst:
    """Start every call at once; return when all have ended (never raises for a call)."""
    assert server.http_url is not None
    seen = Burst()
    seen.results = [RuntimeError("not run")] * len(calls)
    done = anyio.Event()

    async def one(i: int) -> None:
        try:
            seen.results[i] = await calls[i]()
        except Exception as exc:
            seen.results[i] = exc

    async def sample() -> None:
        # Outside any Gate: the server's own view of how many it runs at once.
        async with httpx.AsyncClient(base_url=server.http_url or "") as client:
            while not done.is_set():
                seen.inflight.append((await client.get("/stats")).json()["inflight"])
                await anyio.sleep(0.005)
            seen.last = (await client.get("/stats")).json()

    with anyio.fail_after(90):
        async with anyio.create_task_group() as outer:
            outer.start_soon(sample)
            async with anyio.create_task_group() as tg:
                for i in range(len(calls)):
                    tg.start_soon(one, i)
            done.set()
    return seen
