"""Write progress: is a peer still taking what a front is waiting to send it?

Both fronts close a connection whose pending write makes no progress for the
write timeout, so that a reader that stopped reading cannot hold a slot for
ever. Progress is not simply "the write completed": a socket reports room
only once a good share of its send buffer is free (Linux wakes a writer when
a third is), so behind a multi-megabyte buffer a slow reader that keeps
taking bytes may not free that much within the timeout. Where the kernel
counts the bytes the peer acknowledged (``tcpi_bytes_acked``, Linux 4.2 and
later), a count that grew is progress too; elsewhere only a completed write
is. The peer's kernel acknowledges bytes only while its application reads
(its receive window closes otherwise), so the count is the reader's pace.
"""

from __future__ import annotations

import socket
import struct
import sys

__all__ = ["WriteProgress", "bytes_acked", "check_interval_s"]

# struct tcp_info (linux/tcp.h) is only ever extended: tcpi_bytes_acked, a u64,
# sits at byte 120 since it was added.
_ACKED = struct.Struct("=Q")
_ACKED_AT = 120
_TCP_INFO = getattr(socket, "TCP_INFO", None) if sys.platform.startswith("linux") else None


def check_interval_s(timeout_s: float) -> float:
    """How often a front looks for stalled writes: a quarter of the timeout, at most a
    second, so a stuck write is noticed between 1 and about 1.5 timeouts after its
    peer stopped taking bytes."""
    return min(timeout_s / 4, 1.0)


def bytes_acked(sock: socket.socket) -> int | None:
    """How many bytes the peer has acknowledged on ``sock`` so far.

    ``None`` where the kernel does not say, or once the socket is closed.
    """
    if _TCP_INFO is None:
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, 256)
    except (OSError, ValueError):
        return None
    if len(info) < _ACKED_AT + _ACKED.size:
        return None  # a kernel older than the field
    acked: int = _ACKED.unpack_from(info, _ACKED_AT)[0]
    return acked


class WriteProgress:
    """The progress of one connection's pending write, judged by periodic checks.

    The writer calls ``started`` and ``finished`` around each write (a clock
    read, nothing more: this is on every reply's path); a watchdog calls
    ``stalled`` every so often (a fraction of the timeout) while it waits.
    """

    __slots__ = ("_acked", "_since", "_sock")

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._since: float | None = None  # the last progress seen, while writing
        self._acked: int | None = None  # the peer's count at the last check

    def started(self, now: float) -> None:
        self._since = now

    def finished(self) -> None:
        self._since = None

    def stalled(self, now: float, timeout: float) -> bool:
        """True when the write under way has made no progress for ``timeout`` seconds."""
        if self._since is None:
            return False
        acked = bytes_acked(self._sock)
        if acked is not None:
            if self._acked is not None and acked > self._acked:
                self._since = now  # the peer took bytes since the last check
            self._acked = acked
        return now - self._since >= timeout
