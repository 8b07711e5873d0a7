"""Fuzz: 100,000+ generated frames against the frame parsers, then a live server.

Not part of the test suite (the suite has hypothesis property tests of the
parser; this is the long run). Frames are generated from one seeded
generator: valid ``submit`` / ``stats`` / ``ping`` frames and replies, then
mutated (bytes flipped, inserted or cut, invalid UTF-8, lone surrogate
escapes, values swapped for other JSON types, huge and non-finite numbers,
deep nesting, duplicate and extra keys).

Checked in-process, for every frame:

- ``protocol.decode_request`` returns a request or raises ``FrameError``,
  never anything else;
- the server's msgspec fast path either declines (``None``) or returns a
  submit equal to what ``decode_request`` returns for the same line;
- ``protocol.decode_reply`` on mutated replies returns a reply or raises
  ``ProtocolError``.

Then ``--live`` of the request frames go to a real ``yieldgate serve`` over
one connection: every line must get exactly one terminal reply (a ``frame_too_large``
closes the connection, so oversized lines are left out), the server must
still answer on a second connection, and its counters must add up.

Run it (from the repository root)::

    .venv/bin/python bench/fuzz_frames.py
    .venv/bin/python bench/fuzz_frames.py --frames 200000 --live 50000 --seed 7

The exit status is 1 when any check failed.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import anyio

from _common import add_smoke_flag, smoke
from yieldgate.protocol import (
    FrameError,
    ProtocolError,
    decode_reply,
    decode_request,
    encode_frame,
    error_frame,
    ok_frame,
    ping_frame,
    stats_frame,
    submit_frame,
    yield_frame,
)
from yieldgate.server import spawn
from yieldgate.server._fastframe import fast_submit_decoder

MAX_FRAME = 1 << 20
_VALUES: list[Any] = [
    None,
    True,
    0,
    -1,
    2**70,
    1.5,
    "",
    "x" * 70,
    [],
    {},
    [1, [2]],
    {"a": {"b": None}},
]


def valid_request(rng: random.Random, n: int) -> dict[str, Any]:
    kind = rng.random()
    if kind < 0.1:
        return stats_frame(f"s{n}")
    if kind < 0.2:
        return ping_frame(f"p{n}")
    body = "".join(rng.choice('abc é中\U0001f600\n\t"\\') for _ in range(rng.randint(0, 40)))
    return submit_frame(
        f"r{n}",
        body,
        priority=rng.choice(["low", "normal", "high"]),
        deadline_ms=rng.choice([None, 1, 5000]),
        stream=rng.random() < 0.3,
        params=rng.choice([None, {"exec_ms": 0}, {"exec_ms": rng.randint(0, 3)}]),
    )


def valid_reply(rng: random.Random, n: int) -> dict[str, Any]:
    kind = rng.random()
    rid = f"r{n}"
    if kind < 0.3:
        return ok_frame(rid, {"text": "t"}, 1.5)
    if kind < 0.6:
        return yield_frame(rid, retry_hint_ms=5, inflight=1, max_inflight=1, reason="saturated")
    return error_frame(rid, "backend_error", "m", retryable=True)


def mutate_object(rng: random.Random, frame: dict[str, Any]) -> bytes:
    obj = dict(frame)
    choice = rng.random()
    if choice < 0.3 and obj:
        obj[rng.choice(list(obj))] = rng.choice(_VALUES)
    elif choice < 0.45:
        obj[rng.choice(["op", "id", "body", "sha256", "x", "auth"])] = rng.choice(_VALUES)
    elif choice < 0.55 and obj:
        del obj[rng.choice(list(obj))]
    elif choice < 0.65:
        depth = rng.choice([10, 1000, 100_000])
        obj["params"] = json.loads("[" * min(depth, 500) + "]" * min(depth, 500))
        if depth > 500:
            text = json.dumps(obj)[:-1] + ', "deep": ' + "[" * depth + "]" * depth + "}"
            return text.encode()
    elif choice < 0.75:
        text = json.dumps(obj)
        key = rng.choice(list(obj)) if obj else "id"
        return (text[:-1] + f', "{key}": 1}}').encode()  # a duplicate key
    elif choice < 0.85:
        token = rng.choice(["NaN", "Infinity", "-Infinity", "1e400", "1" * 5000, '"\\ud800"'])
        key = rng.choice(["deadline_ms", "id", "body", "params"])
        text = json.dumps(obj)
        return (text[:-1] + f', "{key}": {token}}}').encode()
    return json.dumps(obj).encode()


def mutate_bytes(rng: random.Random, line: bytes) -> bytes:
    data = bytearray(line)
    for _ in range(rng.randint(1, 4)):
        op = rng.random()
        pos = rng.randrange(len(data) + 1)
        if op < 0.35 and data:
            data[min(pos, len(data) - 1)] = rng.randrange(256)
        elif op < 0.6:
            data[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif op < 0.8:
            del data[pos:]
        else:
            data[pos:pos] = rng.choice([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00", b"\\u0000"])
    return bytes(data)


def frames(
    rng: random.Random, count: int, make: Callable[[random.Random, int], dict[str, Any]]
) -> list[bytes]:
    out = []
    for n in range(count):
        base = make(rng, n)
        line = (
            encode_frame(base)[:-1]
            if rng.random() < 0.15
            else mutate_object(rng, base)
            if rng.random() < 0.5
            else mutate_bytes(rng, encode_frame(base)[:-1])
        )
        out.append(line.replace(b"\n", b" "))
    return out


def check_parsers(requests: list[bytes], replies: list[bytes]) -> Counter[str]:
    problems: Counter[str] = Counter()
    outcomes: Counter[str] = Counter()
    fast = fast_submit_decoder(None)
    for line in requests:
        try:
            reference: Any = decode_request(line)
            outcomes[f"request {type(reference).__name__}"] += 1
        except FrameError as exc:
            reference = exc
            outcomes[f"request error {exc.code}"] += 1
        except Exception as exc:
            problems[f"decode_request raised {type(exc).__name__}"] += 1
            continue
        if fast is None:
            continue
        try:
            got = fast(line)
        except Exception as exc:
            problems[f"fast decoder raised {type(exc).__name__}"] += 1
            continue
        if got is not None and (isinstance(reference, Exception) or got.request() != reference):
            problems["fast decoder accepted what the reference did not, or differently"] += 1
    for line in replies:
        try:
            decode_reply(line)
            outcomes["reply ok"] += 1
        except ProtocolError:
            outcomes["reply error"] += 1
        except Exception as exc:
            problems[f"decode_reply raised {type(exc).__name__}"] += 1
    for key, value in sorted(outcomes.items()):
        print(f"  {key:<40} {value:>8,}")
    return problems


async def check_live(lines: list[bytes], url: str) -> Counter[str]:
    problems: Counter[str] = Counter()
    host, port = url.removeprefix("tcp://").rsplit(":", 1)
    sendable = [line for line in lines if len(line) <= MAX_FRAME]
    async with await anyio.connect_tcp(host, int(port)) as stream:
        replies = 0
        buf = b""

        async def reader() -> None:
            # Terminal replies only: a streamed submit also gets chunks first.
            nonlocal replies, buf
            while replies < len(sendable):
                buf += await stream.receive(65536)
                *done, buf = buf.split(b"\n")
                replies += sum(1 for line in done if b'"status":"chunk"' not in line)

        with anyio.move_on_after(120):
            async with anyio.create_task_group() as tg:
                tg.start_soon(reader)
                for i in range(0, len(sendable), 500):
                    await stream.send(b"".join(line + b"\n" for line in sendable[i : i + 500]))
        if replies != len(sendable):
            problems[f"{len(sendable)} lines got {replies} replies"] += 1
    async with await anyio.connect_tcp(host, int(port)) as probe:
        await probe.send(encode_frame(stats_frame("after")))
        data = b""
        with anyio.fail_after(10):
            while b"\n" not in data:
                data += await probe.receive()
    stats = json.loads(data.split(b"\n")[0])
    admitted = stats["admitted_total"]
    ended = stats["executed_total"] + stats["failed_total"] + stats["cancelled_total"]
    if admitted != ended + stats["inflight"]:
        problems["counters do not add up"] += 1
    print(
        f"  live: {len(sendable):,} lines, {replies:,} replies; server admitted {admitted:,}, "
        f"yielded {stats['yielded_total']:,}, errors {stats['errors_total']:,}"
    )
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--frames", type=int, default=100_000, help="request frames generated")
    parser.add_argument("--live", type=int, default=20_000, help="of which sent to a server")
    parser.add_argument("--seed", type=int, default=1)
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    if smoke(args):
        args.frames, args.live = 2_000, 200
    rng = random.Random(args.seed)
    started = time.perf_counter()
    requests = frames(rng, args.frames, valid_request)
    replies = frames(rng, args.frames // 5, valid_reply)
    print(f"generated {len(requests):,} request and {len(replies):,} reply frames")
    problems = check_parsers(requests, replies)
    with spawn("--max-inflight", "4", "--exec-ms", "1", "--grace-s", "0") as server:
        problems += anyio.run(check_live, requests[: args.live], server.url)
    took = time.perf_counter() - started
    if problems:
        print(f"PROBLEMS after {took:.1f} s:")
        for key, value in problems.items():
            print(f"  {key}: {value}")
        return 1
    print(f"no problems in {took:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
