"""The HTTP fronts: OpenAI, Anthropic, HuggingFace Inference API and TGI dialects.

Beside the TCP front, over the same ``Admission`` (so the same Governor and
backend): a TCP submit and an HTTP request compete for the same slots. A
starlette app (``yieldgate.server._http_app``) is served by uvicorn on
sockets bound here, so port 0 works and the real port is known at once.
Starlette, uvicorn and prometheus_client are imported only when the front
starts serving: this module is light, so ``yieldgate.server`` stays light.

The front accepts connections itself and guards them (``_http_guard``): a
cap on open connections, a timeout and a size cap for each request head, a
timeout for each request body (the app answers it 408), the TCP front's
pause when descriptors run out, and a write timeout that cancels the work of
a reader that stopped reading. With a ``secret``, the app requires
``Authorization: Bearer <secret>`` (or ``x-api-key: <secret>``, as the
anthropic client sends it) on every route but ``/health``.

Lifecycle, driven by ``Server``: ``stop_accepting`` closes the listening
sockets (requests on connections already open are answered
``shutting_down``), ``wait_drained`` waits for admitted requests (streams
included) to finish, and ``close`` cancels what is still running (those
requests are answered ``shutting_down``) and lets uvicorn close every
connection. uvicorn never installs signal handlers here: the process owner
(the CLI) decides what a signal means.
"""

from __future__ import annotations

import logging
import socket
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from yieldgate._extras import require
from yieldgate.protocol import ErrorCode
from yieldgate.server._http_config import HttpConfig
from yieldgate.server.admission import Admission, Admitted, Failure, Finish, Outstanding, R
from yieldgate.server.backends import Backend, Emit
from yieldgate.server.governor import Governor
from yieldgate.server.quota import ProviderQuota

if TYPE_CHECKING:
    from starlette.types import Receive

    from yieldgate.server._http_app import _Uvicorn
    from yieldgate.server._http_guard import ConnectionGuard

__all__ = ["HttpConfig", "HttpFront"]

log = logging.getLogger("yieldgate.server")

# What the front imports when it serves (the server extra); httptools is optional.
_NEEDS = ("starlette", "uvicorn", "prometheus_client")


def require_front(what: str) -> None:
    """``MissingExtraError`` naming ``what`` unless the modules the front serves with are
    installed: checked where a front is asked for, not once serving, where the error would
    hide in a task group."""
    for module in _NEEDS:
        require(module, what)


# Once close() has cancelled the remaining work, how long uvicorn may take to
# close the connections (a client that stopped reading holds one open).
_CLOSE_TIMEOUT_S = 2
_BACKLOG = 2048  # uvicorn's default


def bind_sockets(host: str, port: int) -> list[socket.socket]:
    """Listening-ready sockets for every address ``host`` resolves to, on one port.

    With port 0 the first socket picks a free port and the others reuse it.
    """
    infos = socket.getaddrinfo(
        host or None,
        port,
        type=socket.SOCK_STREAM,
        flags=socket.AI_PASSIVE | socket.AI_ADDRCONFIG,
    )
    sockets: list[socket.socket] = []
    seen: set[tuple[int, Any]] = set()
    try:
        for family, kind, proto, _, sockaddr in infos:
            if (family, sockaddr[0]) in seen:
                continue
            seen.add((family, sockaddr[0]))
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if sockets[0] is not sock:
                sockaddr = (sockaddr[0], sockets[0].getsockname()[1], *sockaddr[2:])
            sock.bind(sockaddr)
            sock.set_inheritable(False)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    if not sockets:
        raise OSError(f"{host!r} resolved to no address")
    return sockets


class HttpFront:
    """Serves the HTTP dialects for one Governor and backend."""

    def __init__(
        self,
        governor: Governor,
        backend: Backend,
        config: HttpConfig | None = None,
        *,
        admission: Admission | None = None,
        stats: Callable[[], dict[str, Any]] | None = None,
        connections: Callable[[], dict[str, int]] | None = None,
    ) -> None:
        require_front("yieldgate.server's HTTP front (HttpConfig)")
        self.governor = governor
        """The Governor that admits or yields each request."""
        self.backend = backend
        """The backend that executes what is admitted."""
        self.admission = admission or Admission(governor, backend)
        """The admission it shares with the other fronts of its server."""
        self.config = config or HttpConfig()
        """Where and how it listens."""
        quota = self.config.quota
        self.quota = None if quota is None else ProviderQuota(quota)
        """The provider quota it emulates (``HttpConfig.quota``); ``None``: none."""
        self.address: tuple[str, int] | None = None
        """The ``(host, port)`` it listens on, once serving; ``None`` before."""
        self.requests: Counter[tuple[str, str]] = Counter()
        """Requests answered, by ``(route, status)``, for ``/metrics``."""
        self.body_timeouts = 0
        """Requests answered 408: the body did not arrive within ``body_timeout_s``."""
        self._stats_source = stats
        self._connections_source = connections
        self._server: _Uvicorn | None = None
        self._guard: ConnectionGuard | None = None
        self._accept_scope: anyio.CancelScope | None = None
        self._accepting = True
        self._closing = False
        self._scopes: set[anyio.CancelScope] = set()
        self._outstanding = Outstanding()
        self._done: anyio.Event | None = None

    # -- lifecycle ----------------------------------------------------------

    async def serve(
        self, *, task_status: anyio.abc.TaskStatus[tuple[str, int]] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Listen, report ``(host, port)`` through ``task_status``, serve until ``close``.

        Needs the asyncio backend (uvicorn runs on it).
        """
        from yieldgate.server._http_app import build_app, make_uvicorn
        from yieldgate.server._http_guard import ConnectionGuard

        self._done = anyio.Event()
        cfg = self.config
        self._guard = ConnectionGuard(
            head_timeout_s=cfg.head_timeout_s,
            body_timeout_s=cfg.body_timeout_s,
            write_timeout_s=cfg.write_timeout_s,
            max_connections=cfg.max_connections,
        )
        sockets = bind_sockets(cfg.host, cfg.port)
        finished = False
        try:
            self.address = (cfg.host, sockets[0].getsockname()[1])
            log.info("HTTP front on %s:%d parses with %s", *self.address, cfg.resolved_parser)
            for sock in sockets:
                sock.listen(_BACKLOG)
                sock.setblocking(False)
            async with anyio.create_task_group() as tg:

                def started() -> None:
                    # uvicorn is ready (its config loaded): connections may come.
                    tg.start_soon(self._accept, sockets)
                    assert self.address is not None
                    task_status.started(self.address)

                self._server = make_uvicorn(build_app(self), _CLOSE_TIMEOUT_S, started)
                if self._closing:
                    self._server.request_exit()
                await self._server.serve()
                tg.cancel_scope.cancel()
            finished = True
        finally:
            if not finished and self._server is not None:
                self._abort(self._server)
            for sock in sockets:
                sock.close()
            self._done.set()

    async def _accept(self, sockets: list[socket.socket]) -> None:
        """Accept on every socket until ``stop_accepting``, then close them."""
        from yieldgate.server._http_app import guarded_protocol
        from yieldgate.server._http_guard import accept_connections

        server, guard = self._server, self._guard
        assert server is not None
        assert guard is not None
        protocol = guarded_protocol(server, guard, self.config.resolved_parser)
        try:
            with anyio.CancelScope() as self._accept_scope:
                if self._accepting:
                    async with anyio.create_task_group() as tg:
                        for sock in sockets:
                            tg.start_soon(
                                accept_connections,
                                sock,
                                protocol,
                                guard,
                                server.server_state.connections,
                            )
        finally:
            # Closed only now that no accept waits on them: new connections are refused.
            for sock in sockets:
                sock.close()

    @staticmethod
    def _abort(server: _Uvicorn) -> None:
        """Tear uvicorn down at once (the task serving it was cancelled)."""
        for connection in list(server.server_state.connections):
            connection.shutdown()
        for task in list(server.server_state.tasks):
            task.cancel()

    def stop_accepting(self) -> None:
        """Close the listening sockets; open connections are still served."""
        self._accepting = False
        if self._accept_scope is not None:
            self._accept_scope.cancel()

    async def wait_drained(self) -> None:
        """Return once no admitted request of this front is executing or streaming."""
        await self._outstanding.wait_idle()

    def close(self) -> None:
        """Cancel admitted work (answered ``shutting_down``) and stop uvicorn."""
        self._closing = True
        self.stop_accepting()
        for scope in list(self._scopes):
            scope.cancel()
        if self._server is not None:
            self._server.request_exit()

    async def wait_closed(self) -> None:
        """Return once ``serve`` has returned (uvicorn closed its connections)."""
        if self._done is not None:
            await self._done.wait()

    # -- state ----------------------------------------------------------------

    def connection_stats(self) -> dict[str, int]:
        """The HTTP connection counters (``http_connections_open``...), in the server's stats."""
        server, guard = self._server, self._guard
        return {
            "http_connections_open": 0 if server is None else len(server.server_state.connections),
            "http_connections_total": 0 if guard is None else guard.accepted,
            "http_connections_refused_total": 0 if guard is None else guard.refused,
            "http_connections_head_timeout_total": 0 if guard is None else guard.head_timeouts,
            "http_connections_head_too_large_total": 0 if guard is None else guard.heads_too_large,
            "http_connections_write_timeout_total": 0 if guard is None else guard.write_timeouts,
            "http_body_timeouts_total": self.body_timeouts,
            "http_requests_total": sum(self.requests.values()),
            **({} if self.quota is None else self.quota.statistics().as_dict()),
        }

    def all_connection_stats(self) -> dict[str, int]:
        """Every front's connection counters (the ``connections`` callable given), for /metrics."""
        if self._connections_source is not None:
            return self._connections_source()
        return self.connection_stats()

    def stats(self) -> dict[str, Any]:
        """What ``GET /stats`` reports: the ``stats`` callable given, else the
        Governor's counters and this front's connections."""
        if self._stats_source is not None:
            return self._stats_source()
        counters = self.governor.stats().as_dict()
        counters.update(self.connection_stats())
        return counters

    # -- one admitted request -----------------------------------------------

    def _track(self) -> anyio.CancelScope:
        """A scope that ``close`` cancels, counted until ``_untrack`` (``wait_drained``)."""
        scope = anyio.CancelScope()
        if self._closing:
            scope.cancel()
        self._scopes.add(scope)
        self._outstanding.add()
        return scope

    def _untrack(self, scope: anyio.CancelScope) -> None:
        self._scopes.discard(scope)
        self._outstanding.done()

    async def run_admitted(
        self,
        admitted: Admitted,
        receive: Receive,
        emit: Emit | None,
        finish: Finish[R],
    ) -> R | Failure | None:
        """Execute admitted work while watching the client; ``None`` if it left.

        A client that disconnects cancels its execution at once (the slot is
        released ``cancelled``); ``close`` cancels it with a ``shutting_down``
        failure as the outcome.
        """
        outcome: R | Failure | None = None
        scope = self._track()
        try:
            async with anyio.create_task_group() as tg:

                async def watch() -> None:
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    tg.cancel_scope.cancel()

                tg.start_soon(watch)
                with scope:
                    outcome = await self.admission.execute(admitted, emit, finish)
                if scope.cancelled_caught:
                    outcome = Failure(
                        code=ErrorCode.SHUTTING_DOWN,
                        message="server shut down before this request finished",
                        retryable=True,
                    )
                tg.cancel_scope.cancel()
        finally:
            self._untrack(scope)
            admitted.slot.release("cancelled")  # a no-op unless cancelled
        return outcome
