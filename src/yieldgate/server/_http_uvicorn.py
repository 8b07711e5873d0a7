"""The uvicorn server behind the HTTP front, without listeners of its own.

The front (``yieldgate.server.http``) binds and accepts; ``make_uvicorn``
builds the server that only serves, and ``guarded_protocol`` the protocol
factory that hands it each accepted connection behind its guard
(``_http_guard``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import uvicorn
from starlette.types import ASGIApp

from yieldgate.server._http_guard import ConnectionGuard, Parser, protocol_class

__all__ = ["guarded_protocol", "make_uvicorn"]


class _Uvicorn(uvicorn.Server):
    """uvicorn without listeners, signal handlers or polling delays.

    The front accepts connections itself and hands each to a guarded protocol
    (``guarded_protocol``), so this server only serves them: it reports when
    it is ready, ends its main loop as soon as it is asked to (uvicorn polls
    every 100 ms) and shuts down without uvicorn's fixed pauses: close idle
    connections (busy ones close after their response), wait up to the
    graceful timeout, then cancel what is left.
    """

    def __init__(self, config: uvicorn.Config, on_started: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_started = on_started
        self._exit = anyio.Event()

    def request_exit(self) -> None:
        self.should_exit = True
        self._exit.set()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # The process owner (the CLI) handles SIGINT/SIGTERM through Server.request_stop.
        yield

    async def startup(self, sockets: Any = None) -> None:
        # No lifespan (it is off) and no listener of uvicorn's own.
        self.servers = []
        self.started = True
        self._on_started()

    async def main_loop(self) -> None:
        counter = 0
        while not await self.on_tick(counter):  # once a second: the date header
            counter = (counter + 1) % 864_000
            with anyio.move_on_after(0.1):
                await self._exit.wait()

    async def shutdown(self, sockets: Any = None) -> None:
        state = self.server_state
        for connection in list(state.connections):
            connection.shutdown()
        with anyio.move_on_after(self.config.timeout_graceful_shutdown or 0):
            # uvicorn's connection and task sets have no event to wait on.
            while state.connections or state.tasks:  # noqa: ASYNC110
                await anyio.sleep(0.005)
        for task in list(state.tasks):
            task.cancel()


def make_uvicorn(app: ASGIApp, close_timeout_s: int, on_started: Callable[[], None]) -> _Uvicorn:
    """A uvicorn server for ``app``: it serves the connections ``guarded_protocol`` is given."""
    config = uvicorn.Config(
        app,
        lifespan="off",
        log_config=None,
        access_log=False,
        proxy_headers=False,
        server_header=False,
        ws="none",
        timeout_graceful_shutdown=close_timeout_s,
    )
    return _Uvicorn(config, on_started)


def guarded_protocol(
    server: uvicorn.Server, guard: ConnectionGuard, parser: Parser
) -> Callable[[], asyncio.Protocol]:
    """A protocol factory for connections the front accepted, served by ``server``
    and parsed by ``parser``."""
    config = server.config
    state = server.server_state
    cls = protocol_class(parser)

    def protocol() -> asyncio.Protocol:
        return cls(config=config, server_state=state, app_state={}, guard=guard)

    return protocol
