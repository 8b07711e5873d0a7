"""The server: one Governor and one backend behind the fronts, with a lifecycle.

``Server.run`` binds the fronts (TCP, and HTTP when configured: both share one
``Admission``, so their clients compete for the same slots), starts the
backend's warm-up beside them (the fronts answer ``cold_start`` meanwhile) and
serves until ``request_stop``. Shutdown is graceful: stop accepting, answer
new requests ``shutting_down``, let admitted work finish for up to
``grace_s``, then cancel what is left (those requests get ``shutting_down``
too) and close every connection.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel

from yieldgate.server.admission import Admission
from yieldgate.server.backends import Backend
from yieldgate.server.governor import Governor
from yieldgate.server.http import HttpConfig, HttpFront
from yieldgate.server.tcp import TcpConfig, TcpFront

__all__ = ["Server", "format_url"]

log = logging.getLogger("yieldgate.server")

# After close(), how long the HTTP front may take to answer what it cancelled
# and close its connections before it is torn down.
_HTTP_CLOSE_WAIT_S = 5.0


def format_url(scheme: str, host: str, port: int) -> str:
    """``scheme://host:port``, with IPv6 hosts in brackets."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}"


class Server:
    """A Governor, a backend, the TCP front and optionally the HTTP fronts, run as one unit."""

    def __init__(
        self,
        governor: Governor,
        backend: Backend,
        *,
        tcp: TcpConfig | None = None,
        http: HttpConfig | None = None,
        grace_s: float = 10.0,
    ) -> None:
        if not (grace_s >= 0 and math.isfinite(grace_s)):
            raise ValueError(f"grace_s must be a finite number >= 0, got {grace_s}")
        self.governor = governor
        """The Governor every front admits through."""
        self.backend = backend
        """The backend that executes admitted work."""
        admission = Admission(governor, backend)
        self.tcp = TcpFront(governor, backend, tcp, admission=admission, stats=self.stats)
        """The governed TCP front."""
        self.http: HttpFront | None = None
        """The HTTP fronts (OpenAI, Anthropic, HuggingFace, TGI dialects); ``None`` without
        ``http``."""
        if http is not None:
            self.http = HttpFront(
                governor,
                backend,
                http,
                admission=admission,
                stats=self.stats,
                connections=self.connection_stats,
            )
        self.urls: tuple[str, ...] = ()
        """Where the fronts listen (TCP first), once ``run`` has bound them; empty before."""
        self.grace_s = grace_s
        """Seconds admitted work may take to finish on shutdown before it is cancelled."""
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
        """The Governor's counters and every front's connections (the ``stats`` op, ``/stats``).

        A backend with a ``stats()`` method (the harness engine) adds its own
        counters under ``"backend"``.
        """
        counters = self.governor.stats().as_dict()
        counters.update(self.connection_stats())
        backend_stats = getattr(self.backend, "stats", None)
        if callable(backend_stats):
            counters["backend"] = backend_stats()
        return counters

    def connection_stats(self) -> dict[str, int]:
        """Every front's connection counters."""
        counters = self.tcp.connection_stats()
        if self.http is not None:
            counters.update(self.http.connection_stats())
        return counters

    async def run(
        self,
        *,
        on_ready: Callable[[str], None] | None = None,
        task_status: anyio.abc.TaskStatus[str] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Serve until stopped.

        Once every front listens, ``on_ready`` is called with each front's URL
        (TCP first, then HTTP), ``task_status`` receives the TCP URL and
        ``urls`` holds them all.
        """
        self._stop, self._hard = anyio.Event(), anyio.Event()
        if self._stop_requested:
            self._stop.set()
        if self._hard_requested:
            self._hard.set()
        try:
            async with anyio.create_task_group() as tg:
                host, port = await tg.start(self.tcp.serve)
                urls = [format_url("tcp", host, port)]
                if self.http is not None:
                    host, port = await tg.start(self.http.serve)
                    urls.append(format_url("http", host, port))
                tg.start_soon(self._warm_up)
                # Let the warm-up begin (a cold start is declared before its first
                # wait), so that no request gets in before the backend said it is cold.
                await anyio.lowlevel.checkpoint()
                self.urls = tuple(urls)
                if on_ready is not None:
                    for url in urls:
                        on_ready(url)
                task_status.started(urls[0])
                await self._stop.wait()
                log.info("shutting down: no new work, grace %.1fs", self.grace_s)
                self.governor.begin_shutdown()
                self.tcp.stop_accepting()
                if self.http is not None:
                    self.http.stop_accepting()
                with anyio.move_on_after(self.grace_s):
                    await self._drained_or_hard()
                self.tcp.close()
                if self.http is not None:
                    self.http.close()
                    with anyio.move_on_after(_HTTP_CLOSE_WAIT_S):
                        await self.http.wait_closed()
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
                if self.http is not None:
                    await self.http.wait_drained()
                tg.cancel_scope.cancel()

            async def hard() -> None:
                await hard_event.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(drained)
            tg.start_soon(hard)
