"""A bare NDJSON echo server: the baseline that ``bench/governor.py`` compares against.

Same stack and read strategy as the TCP front (``yieldgate.server._tcp_serving``):
anyio on asyncio with uvloop, one task per connection, ``receive(65536)`` into a ``bytearray``,
``find(b"\\n")`` for each line, and every reply produced from one receive
coalesced into one ``send``. Minus JSON, hashing and governance: each line is
written back unchanged. Binds 127.0.0.1 on ``--port`` (0 picks a free one) and
prints ``listening tcp://HOST:PORT`` once ready.

Run on its own: ``.venv/bin/python bench/_echo_server.py --port 0``.
"""

from __future__ import annotations

import argparse
import contextlib

import anyio
import anyio.abc
from anyio.abc import SocketAttribute

HOST = "127.0.0.1"
_READ_SIZE = 65536
_BROKEN = (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream, OSError)


async def _read_loop(stream: anyio.abc.SocketStream) -> None:
    """Echo every complete line of ``stream``, one send per receive."""
    buf = bytearray()
    scanned = 0
    while True:
        try:
            data = await stream.receive(_READ_SIZE)
        except _BROKEN:
            return
        buf += data
        out: list[bytes] = []
        start = 0
        while (nl := buf.find(b"\n", scanned)) >= 0:
            out.append(bytes(buf[start : nl + 1]))
            start = scanned = nl + 1
        if start:
            del buf[:start]
        scanned = len(buf)
        if out:
            try:
                await stream.send(b"".join(out))
            except _BROKEN:
                return


async def _handle(stream: anyio.abc.SocketStream) -> None:
    async with stream:
        await _read_loop(stream)


async def main(port: int) -> None:
    """Listen on 127.0.0.1:``port`` and echo until killed."""
    listener = await anyio.create_tcp_listener(local_host=HOST, local_port=port)
    async with listener:
        bound = listener.extra(SocketAttribute.local_port)
        print(f"listening tcp://{HOST}:{bound}", flush=True)
        await listener.serve(_handle)


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0, help="TCP port; 0 picks a free one")
    return parser.parse_args()


if __name__ == "__main__":
    args = _parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        anyio.run(main, args.port, backend="asyncio", backend_options={"use_uvloop": True})
