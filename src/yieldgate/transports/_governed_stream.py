"""``GovernedStream``: the chunks of one streamed submit, as they arrive.

``GovernedClient.stream`` opens it on the first reply, which the Gate has
already accepted; from there on a failure is not retried (a retry would repeat
output) but raised as ``StreamInterruptedError`` with the chunks delivered.
"""

from __future__ import annotations

from typing import Any

from anyio.streams.memory import MemoryObjectReceiveStream

from yieldgate._exceptions import ProtocolError, StreamInterruptedError, YieldgateError
from yieldgate.protocol import ChunkReply, OkReply, Reply
from yieldgate.transports._governed_connection import Connection, next_reply
from yieldgate.transports._governed_outcome import classify_reply

__all__ = ["GovernedStream"]


class GovernedStream:
    """The chunks of one streamed submit, as an async iterator of their ``data``.

    After the iteration ends, ``result`` holds the terminal ``ok`` reply's
    result, ``chunks`` how many chunks arrived and ``received`` their data.
    A failure after the first chunk raises ``StreamInterruptedError``, which
    carries ``received`` as its ``chunks``.
    """

    def __init__(
        self,
        conn: Connection,
        rid: str,
        receive: MemoryObjectReceiveStream[Reply],
        first: Reply,
    ) -> None:
        self._conn = conn
        self._rid = rid
        self._receive = receive
        self._next: Reply | None = first
        self._done = False
        self.complete = False
        self.result: Any = None
        self.chunks = 0
        self.received: list[Any] = []

    def __aiter__(self) -> GovernedStream:
        return self

    async def __anext__(self) -> Any:
        if self._done:
            raise StopAsyncIteration
        reply = self._next
        self._next = None
        if reply is None:
            try:
                reply = await next_reply(self._conn, self._receive)
            except YieldgateError as exc:
                self._done = True
                raise self._interrupted(exc) from exc
        if isinstance(reply, ChunkReply):
            self.chunks += 1
            self.received.append(reply.data)
            return reply.data
        self._done = True
        self.complete = True
        if isinstance(reply, OkReply):
            self.result = reply.result
            raise StopAsyncIteration
        error = classify_reply(reply).error
        if not isinstance(error, YieldgateError):
            error = ProtocolError(f"stream ended with an unexpected {type(reply).__name__}")
        if not self.chunks:
            raise error  # nothing was delivered (an ok-less first reply cannot get here)
        raise self._interrupted(error) from error

    def _interrupted(self, error: YieldgateError) -> StreamInterruptedError:
        return StreamInterruptedError(
            f"stream failed after {self.chunks} chunk(s), which were delivered and are "
            f"not repeated: {error.message}",
            chunks=list(self.received),
        )
