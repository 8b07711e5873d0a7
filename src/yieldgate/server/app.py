"""The server: one Governor and one backend behind the fronts, with a lifecycle.

``Server.run`` binds the fronts, starts the backend's warm-up beside them (the
fronts answer ``cold_start`` meanwhile) and serves until ``request_stop``.
Shutdown is graceful: stop accepting, answer new submits ``shutting_down``,
let admitted work finish for up to ``grace_s``, then cancel what is left
(those submits get ``shutting_down`` too) and close every connection.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import anyio
import anyio.abc

from yieldgate.server.backends import Backend
from yieldgate.server.governor import Governor
from yieldgate.server.tcp import TcpConfig, TcpFront

__all__ = ["Server", "format_url"]

log = logging.getLogger("yieldgate.server")


def format_url(scheme: str, host: str, port: int) -> str:
    """``scheme://host:port``, with IPv6 hosts in brackets."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}"


class Server:
    """A Governor, a backend and the TCP front, run as one unit."""

    def __init__(
        self,
        governor: Governor,
        backend: Backend,
        *,
        tcp: TcpConfig | None = None,
        grace_s: float = 10.0,
    ) -> None:
        if not (grace_s >= 0 and math.isfinite(grace_s)):
            raise ValueError(f"grace_s must be a finite number >= 0, got {grace_s}")
        self.governor = governor
        self.backend = backend
        self.tcp = TcpFront(governor, backend, tcp)
        self.grace_s = grace_s
        self._stop_requested = False
        self._hard_requested = False
        # anyio events need a running loop: made in run().
        self._stop: anyio.Event | None = None
        self._hard: anyio.Event | None = None

    def request_stop(self, *, hard: bool = False) -> None:
        """Begin a graceful shutdown; ``hard`` skips the grace period."""
        self._stop_requested = True
        self._hard_requested = self._hard_requested or hard
        if self._stop is not None:
            self._stop.set()
        if self._hard is not None and self._hard_requested:
            self._hard.set()

    def stats(self) -> dict[str, Any]:
        return self.tcp.stats()

    async def run(
        self,
        *,
        on_ready: Callable[[str], None] | None = None,
        task_status: anyio.abc.TaskStatus[str] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Serve until stopped. ``on_ready`` and ``task_status`` receive the TCP URL."""
        self._stop, self._hard = anyio.Event(), anyio.Event()
        if self._stop_requested:
            self._stop.set()
        if self._hard_requested:
            self._hard.set()
        try:
            async with anyio.create_task_group() as tg:
                host, port = await tg.start(self.tcp.serve)
                tg.start_soon(self._warm_up)
                url = format_url("tcp", host, port)
                if on_ready is not None:
                    on_ready(url)
                task_status.started(url)
                await self._stop.wait()
                log.info("shutting down: no new work, grace %.1fs", self.grace_s)
                self.governor.begin_shutdown()
                self.tcp.stop_accepting()
                with anyio.move_on_after(self.grace_s):
                    await self._drained_or_hard()
                self.tcp.close()
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await self.backend.aclose()

    async def _warm_up(self) -> None:
        await self.backend.start(self.governor)
        log.info("backend %s is warm", self.backend.name)

    async def _drained_or_hard(self) -> None:
        assert self._hard is not None
        hard_event = self._hard
        async with anyio.create_task_group() as tg:

            async def drained() -> None:
                await self.tcp.wait_drained()
                tg.cancel_scope.cancel()

            async def hard() -> None:
                await hard_event.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(drained)
            tg.start_soon(hard)
