"""Misbehaving HTTP peers on loopback, for the transports' fault tests.

A real socket server in a thread, so that the transports' own network code
(httpcore's reads and their timeouts) meets the fault, not a scripted body.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest


@dataclass
class DrippingUpstream:
    """Answers every request with ``status`` and its headers at once, then the body a byte
    every ``interval_s``. ``requests`` counts the requests it read; ``closed_early`` the
    connections the client closed before the whole body was sent."""

    url: str
    status: bytes
    headers: dict[str, str]
    body: bytes
    interval_s: float
    requests: int = 0
    closed_early: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def serve(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            head, _, rest = data.partition(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            while len(rest) < length:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                rest += chunk
            with self.lock:
                self.requests += 1
            # One request per connection, and said so: a client that reused it would
            # race the close (a reset on a loaded machine).
            lines = [
                b"HTTP/1.1 " + self.status,
                f"content-length: {len(self.body)}".encode(),
                b"connection: close",
            ]
            lines += [f"{name}: {value}".encode() for name, value in self.headers.items()]
            try:
                conn.sendall(b"\r\n".join(lines) + b"\r\n\r\n")
                for i in range(len(self.body)):
                    if self.stop.wait(self.interval_s):
                        return
                    conn.sendall(self.body[i : i + 1])
            except OSError:  # the client closed the connection before the end
                with self.lock:
                    self.closed_early += 1


@contextlib.contextmanager
def dripping_upstream(
    status: bytes, headers: dict[str, str], body: bytes, interval_s: float = 0.5
) -> Iterator[DrippingUpstream]:
    """A ``DrippingUpstream`` on 127.0.0.1 (port 0), stopped and joined on exit, also on error."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        upstream = DrippingUpstream(f"http://127.0.0.1:{port}", status, headers, body, interval_s)
        workers: list[threading.Thread] = []

        def accept() -> None:
            while not upstream.stop.is_set():
                try:
                    conn, _ = listener.accept()
                except OSError:  # the listener was closed: the test is over
                    return
                worker = threading.Thread(target=upstream.serve, args=(conn,), daemon=True)
                workers.append(worker)
                worker.start()

        acceptor = threading.Thread(target=accept, daemon=True)
        acceptor.start()
        try:
            yield upstream
        finally:
            upstream.stop.set()
            # accept() returns once the listener is shut down and closed.
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
            acceptor.join(10)
            for worker in workers:
                worker.join(10)


@pytest.fixture
def slow_429() -> Iterator[DrippingUpstream]:
    """A 429 whose JSON body comes a byte every 0.5 s (11 s in all); its hint, 30 s."""
    body = b'{"error": "slow down"}'
    headers = {"content-type": "application/json", "retry-after": "30"}
    with dripping_upstream(b"429 Too Many Requests", headers, body) as upstream:
        yield upstream
