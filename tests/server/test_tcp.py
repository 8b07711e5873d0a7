"""The TCP front against real ``yieldgate serve`` processes: every promise, every error code."""

from __future__ import annotations

import json
import random
import signal
import socket
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.conftest import RawClient, send_line, submit
from yieldgate.protocol import (
    YieldReason,
    encode_frame,
    encode_yield,
    ping_frame,
    sha256_hex,
    stats_frame,
)
from yieldgate.server import ServerProcess
from yieldgate.server._tcp_serving import YieldReplies
from yieldgate.server.governor import Yield

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]


def assert_counters_add_up(stats: dict[str, Any]) -> None:
    """Every admitted submit ended exactly one way, or is still in flight."""
    ended = stats["executed_total"] + stats["failed_total"] + stats["cancelled_total"]
    assert stats["admitted_total"] == ended + stats["inflight"], stats


async def test_ping_and_stats(serve: Any, connect: Any) -> None:
    server = serve("--max-inflight", "3")
    c = await connect(server)
    assert await c.request(ping_frame("p1")) == {"id": "p1", "status": "ok", "op": "pong"}
    stats = await c.request(stats_frame("s1"))
    assert (stats["id"], stats["status"], stats["op"]) == ("s1", "ok", "stats")
    for key in ("inflight", "max_inflight", "executed_total", "yielded_total", "errors_total"):
        assert isinstance(stats[key], int)
    assert stats["max_inflight"] == 3
    assert stats["connections_open"] == 1


async def test_submit_executes_and_reports_exec_ms(serve: Any, connect: Any) -> None:
    server = serve("--exec-ms", "50")
    c = await connect(server)
    reply = await c.submit("hello world")
    assert reply["status"] == "ok"
    assert reply["result"] == {"text": "hello world", "prompt_tokens": 11, "completion_tokens": 11}
    assert 45 <= reply["exec_ms"] < 2000
    stats = await c.stats()
    assert (stats["executed_total"], stats["inflight"]) == (1, 0)
    assert_counters_add_up(stats)


async def test_one_connection_is_multiplexed(serve: Any, connect: Any) -> None:
    server = serve("--max-inflight", "8")
    c = await connect(server)
    await c.send(submit("slow", params={"exec_ms": 600}))
    await c.send(submit("fast", params={"exec_ms": 10}))
    await c.send(ping_frame("ping"))
    order = [(await c.recv())["id"] for _ in range(3)]
    assert order.index("fast") < order.index("slow")
    assert order.index("ping") < order.index("slow")


async def test_seed_promises_yield_at_once_with_an_honest_hint(serve: Any, connect: Any) -> None:
    exec_ms = 30_000
    server = serve("--max-inflight", "1", "--exec-ms", str(exec_ms))
    owner, other = await connect(server), await connect(server)
    # The hint is the execution's expected remaining time. However slow this
    # machine is, it lies between what the times measured around the admission
    # and around the yield allow: no window that a slow run could miss.
    before_admission = time.monotonic()
    await owner.send(submit("long"))
    await other.stats_when(lambda s: s["inflight"] == 1)
    after_admission = time.monotonic()
    await anyio.sleep(0.5)  # let some of the execution pass (at least this much)
    sent = time.monotonic()
    reply = await other.submit("x")
    received = time.monotonic()
    assert reply["status"] == "yield"
    assert (reply["reason"], reply["inflight"], reply["max_inflight"]) == ("saturated", 1, 1)
    elapsed_min_ms = (sent - after_admission) * 1000
    elapsed_max_ms = (received - before_admission) * 1000
    assert exec_ms - elapsed_max_ms - 1 <= reply["retry_hint_ms"] <= exec_ms - elapsed_min_ms + 1
    # Not queued behind the execution: the yield came while it still runs.
    stats = await other.stats()
    assert (stats["inflight"], stats["executed_total"], stats["yielded_total"]) == (1, 0, 1)
    await anyio.sleep(0.1)
    later = await other.submit("y")
    assert later["retry_hint_ms"] < reply["retry_hint_ms"]  # counts down, not a constant


async def test_inflight_never_exceeds_max_inflight(serve: Any, connect: Any) -> None:
    server = serve("--max-inflight", "3", "--exec-ms", "200")
    clients = [await connect(server) for _ in range(10)]
    monitor = await connect(server)
    samples: list[int] = []
    replies: list[dict[str, Any]] = []
    done = anyio.Event()

    async def sample() -> None:
        while not done.is_set():
            samples.append((await monitor.stats())["inflight"])

    async def burst(c: RawClient) -> None:
        for _ in range(5):
            replies.append(await c.submit("w"))
            await anyio.sleep(0.03)

    async with anyio.create_task_group() as tg:
        tg.start_soon(sample)
        async with anyio.create_task_group() as fire:
            for c in clients:
                fire.start_soon(burst, c)
        done.set()
    assert max(samples) <= 3
    assert 3 in samples
    stats = await monitor.stats()
    assert stats["inflight_peak"] == 3
    oks = sum(r["status"] == "ok" for r in replies)
    yields = sum(r["status"] == "yield" for r in replies)
    assert oks + yields == 50
    assert (stats["executed_total"], stats["yielded_total"]) == (oks, yields)
    assert_counters_add_up(stats)


async def test_bad_frame_keeps_the_connection_open(serve: Any, connect: Any) -> None:
    server = serve()
    c = await connect(server)
    await c.send(b"this is not json\n")
    reply = await c.recv()
    assert reply["status"] == "error"
    assert (reply["code"], reply["id"], reply["retryable"]) == ("bad_frame", None, False)
    await c.send(b'{"op": "submit", "id": "q", "body": 3}\n')
    reply = await c.recv()
    assert (reply["code"], reply["id"]) == ("bad_frame", "q")
    assert (await c.request(ping_frame("after")))["op"] == "pong"


async def test_frame_too_large_closes_only_that_connection(serve: Any, connect: Any) -> None:
    server = serve("--max-frame-bytes", "1024", "--exec-ms", "300", "--max-inflight", "4")
    victim, bystander = await connect(server), await connect(server)
    await bystander.send(submit("keep"))
    await victim.send(submit("mine"))
    await bystander.stats_when(lambda s: s["inflight"] == 2)
    await victim.send(
        b'{"op": "ping", "id": "' + b"x" * 2000 + b'"}\n' + encode_frame(ping_frame("unread"))
    )
    reply = await victim.recv_for(None)
    assert (reply["code"], reply["retryable"]) == ("frame_too_large", False)
    # Work admitted before the bad frame still gets its one terminal reply...
    assert (await victim.recv_for("mine"))["status"] == "ok"
    # ...then the connection closes; nothing after the bad frame was read.
    assert await victim.closed_by_peer()
    assert (await bystander.recv_for("keep"))["status"] == "ok"
    stats = await bystander.stats_when(lambda s: s["inflight"] == 0)
    assert (stats["executed_total"], stats["cancelled_total"]) == (2, 0)
    assert_counters_add_up(stats)


async def test_frame_too_large_without_a_newline(serve: Any, connect: Any) -> None:
    server = serve("--max-frame-bytes", "1024")
    c = await connect(server)
    await c.send(b"{" + b" " * 5000)  # never terminated
    reply = await c.recv()
    assert reply["code"] == "frame_too_large"
    assert await c.closed_by_peer()


async def test_a_frame_at_the_limit_is_accepted(serve: Any, connect: Any) -> None:
    server = serve("--max-frame-bytes", "1024", "--exec-ms", "1")
    c = await connect(server)
    frame = submit("edge", "")
    base = len(encode_frame(frame)) - 1
    frame = submit("edge", "b" * (1024 - base))
    line = encode_frame(frame)
    assert len(line) - 1 == 1024
    await c.send(line)
    assert (await c.recv())["status"] == "ok"


async def test_integrity_mismatch(serve: Any, connect: Any) -> None:
    server = serve()
    c = await connect(server)
    frame = submit("t", "what I meant")
    frame["body"] = "what arrived"
    reply = await c.request(frame)
    assert (reply["code"], reply["retryable"]) == ("integrity_mismatch", True)
    stats = await c.stats()
    assert (stats["admitted_total"], stats["errors_by_code"]) == (0, {"integrity_mismatch": 1})


async def test_unknown_op(serve: Any, connect: Any) -> None:
    c = await connect(serve())
    reply = await c.request({"op": "resume", "id": "u"})
    assert (reply["code"], reply["id"]) == ("unknown_op", "u")


# -- cancel (protocol 1.1) ------------------------------------------------------
# Frames are spelled by hand, as a client in any language would send them.


async def assert_no_reply_before_pong(c: RawClient) -> None:
    """Nothing is owed on this connection: a ping's pong is the very next reply."""
    await c.send(ping_frame("probe"))
    assert await c.recv() == {"id": "probe", "status": "ok", "op": "pong"}


async def test_cancel_frees_the_slot_at_once_and_answers_cancelled(
    serve: Any, connect: Any
) -> None:
    # Issue 16 item 11: an abandoned submit held its slot to the end, counted executed.
    server = serve("--max-inflight", "1", "--exec-ms", "60000")
    c, other = await connect(server), await connect(server)
    await c.send(submit("w"))
    await other.stats_when(lambda s: s["inflight"] == 1)
    await c.send({"op": "cancel", "id": "w"})
    reply = await c.recv()
    assert (reply["id"], reply["status"], reply["code"], reply["retryable"]) == (
        "w",
        "error",
        "cancelled",
        False,
    )
    # The slot is back at once: another client is admitted in the next breath.
    assert (await other.submit("next", params={"exec_ms": 1}))["status"] == "ok"
    stats = await other.stats()
    assert (stats["cancelled_total"], stats["executed_total"], stats["inflight"]) == (1, 1, 0)
    assert stats["errors_by_code"] == {"cancelled": 1}
    assert_counters_add_up(stats)
    # The cancel frame got no reply of its own, and the id may be used again.
    await assert_no_reply_before_pong(c)
    assert (await c.submit("again", params={"exec_ms": 1}))["status"] == "ok"


async def test_a_cancel_read_with_its_submit_still_cancels_it(serve: Any, connect: Any) -> None:
    # Both lines in one read: the cancel comes before the submit's task has even started.
    server = serve("--max-inflight", "1", "--exec-ms", "60000")
    c = await connect(server)
    await c.send(encode_frame(submit("w")) + encode_frame({"op": "cancel", "id": "w"}))
    reply = await c.recv()
    assert (reply["id"], reply["code"]) == ("w", "cancelled")
    stats = await c.stats()
    assert (stats["admitted_total"], stats["cancelled_total"], stats["inflight"]) == (1, 1, 0)


async def test_a_cancel_for_an_id_not_in_flight_is_ignored(serve: Any, connect: Any) -> None:
    server = serve("--max-inflight", "2", "--exec-ms", "60000")
    c, other = await connect(server), await connect(server)
    done = await c.submit("done", params={"exec_ms": 1})
    assert done["status"] == "ok"
    await c.send(submit("mine"))
    await c.stats_when(lambda s: s["inflight"] == 1)
    # Unknown, already answered, or in flight on another connection: no reply, no effect.
    for frame in ({"op": "cancel", "id": "never"}, {"op": "cancel", "id": "done"}):
        await c.send(frame)
    await other.send({"op": "cancel", "id": "mine"})
    await assert_no_reply_before_pong(c)
    await assert_no_reply_before_pong(other)
    stats = await other.stats()
    assert (stats["inflight"], stats["cancelled_total"], stats["errors_total"]) == (1, 0, 0)


async def test_cancel_ends_a_stream_with_no_chunk_after_it(serve: Any, connect: Any) -> None:
    server = serve("--max-inflight", "1")
    c = await connect(server)
    params = {"exec_ms": 60_000, "chunks": 1000}
    await c.send(submit("s", "a long streamed answer", stream=True, params=params))
    first = await c.recv_for("s")
    assert (first["status"], first["seq"]) == ("chunk", 0)
    await c.send({"op": "cancel", "id": "s"})
    while (reply := await c.recv_for("s"))["status"] == "chunk":
        pass
    assert (reply["status"], reply["code"], reply["retryable"]) == ("error", "cancelled", False)
    # The terminal reply is the last word about "s": nothing of it follows.
    await assert_no_reply_before_pong(c)
    stats = await c.stats()
    assert (stats["inflight"], stats["cancelled_total"]) == (0, 1)
    assert_counters_add_up(stats)


async def test_a_cancel_needs_the_secret_like_any_frame(
    serve: Any, connect: Any, tmp_path: Path
) -> None:
    secret = tmp_path / "secret"
    secret.write_text("k")
    server = serve("--secret-file", str(secret), "--exec-ms", "60000")
    c = await connect(server)
    await c.send(submit("w", auth="k"))  # admitted before the next line is read
    reply = await c.request({"op": "cancel", "id": "w"})
    assert (reply["code"], reply["id"]) == ("unauthorized", "w")
    await c.send({"op": "cancel", "id": "w", "auth": "k"})
    assert (await c.recv_for("w"))["code"] == "cancelled"


async def test_a_stream_honours_its_deadline(serve: Any, connect: Any) -> None:
    server = serve("--max-inflight", "1")
    c = await connect(server)
    params = {"exec_ms": 60_000, "chunks": 600}  # a chunk every 100 ms
    await c.send(submit("s", "x" * 600, stream=True, deadline_ms=300, params=params))
    while (reply := await c.recv_for("s"))["status"] == "chunk":
        pass
    assert (reply["code"], reply["retryable"]) == ("deadline_exceeded", False)
    stats = await c.stats()
    assert (stats["inflight"], stats["cancelled_total"]) == (0, 1)


async def test_duplicate_id_only_while_in_flight(serve: Any, connect: Any) -> None:
    server = serve("--exec-ms", "300", "--max-inflight", "4")
    c, other = await connect(server), await connect(server)
    await c.send(submit("same"))
    await c.send(submit("same"))
    first = await c.recv()
    assert (first["code"], first["id"]) == ("duplicate_id", "same")
    # Another connection has its own id space.
    assert (await other.request(submit("same")))["status"] == "ok"
    assert (await c.recv_for("same"))["status"] == "ok"
    # Once answered, the id may be used again.
    assert (await c.request(submit("same")))["status"] == "ok"


async def test_auth_with_a_shared_secret(serve: Any, connect: Any, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("correct horse\n")
    server = serve("--secret-file", str(secret), "--exec-ms", "1")
    c = await connect(server)
    for frame in (submit("a"), submit("b", auth="wrong"), {"op": "stats", "id": "c"}):
        reply = await c.request(frame)
        assert (reply["code"], reply["retryable"]) == ("unauthorized", False)
    assert (await c.request(submit("d", auth="correct horse")))["status"] == "ok"
    stats = await c.request({**stats_frame("e"), "auth": "correct horse"})
    assert stats["errors_by_code"] == {"unauthorized": 3}


async def test_backend_error(serve: Any, connect: Any) -> None:
    server = serve("--exec-ms", "1")
    c = await connect(server)
    reply = await c.submit("x", params={"fail": True})
    assert (reply["status"], reply["code"], reply["retryable"]) == ("error", "backend_error", True)
    stats = await c.stats()
    assert (stats["failed_total"], stats["executed_total"], stats["inflight"]) == (1, 0, 0)
    assert_counters_add_up(stats)


async def test_bad_params_are_refused_before_admission(serve: Any, connect: Any) -> None:
    server = serve("--exec-ms", "1000", "--max-inflight", "1")
    c = await connect(server)
    for params in ({"exec_ms": -1}, {"exec_ms": "soon"}, {"exec_ms": 10**30}):
        bad = await c.submit("x", params=params)
        assert (bad["code"], bad["retryable"]) == ("backend_error", False)
    bad_stream = await c.submit("x", stream=True, params={"chunks": 0})
    assert bad_stream["code"] == "backend_error"
    stats = await c.stats()
    # No slot was taken and no execution time was measured for them.
    assert (stats["admitted_total"], stats["exec_ms_ewma"]) == (0, None)


@pytest.mark.parametrize(
    "line",
    [
        b'{"op":"submit","id":"d","body":"","sha256":"'
        + sha256_hex("").encode()
        + b'","deadline_ms":1'
        + b"0" * 400
        + b"}",
        b'{"op":"submit","id":"e","body":"","sha256":"'
        + sha256_hex("").encode()
        + b'","params":{"exec_ms":1'
        + b"0" * 400
        + b"}}",
        b'{"op":"ping","id":"\\ud800"}',
        b'{"op":"submit","id":"s","body":"\\udfff","sha256":"' + b"0" * 64 + b'"}',
        b'{"op":"submit","id":"n","body":"x","sha256":"'
        + sha256_hex("x").encode()
        + b'","params":{"echo":"\\ud800"}}',
    ],
    ids=["huge-deadline", "huge-exec-ms", "surrogate-id", "surrogate-body", "surrogate-param"],
)
async def test_lines_that_once_crashed_the_server(serve: Any, connect: Any, line: bytes) -> None:
    server = serve("--exec-ms", "1")
    c = await connect(server)
    await c.send(line + b"\n")
    reply = await c.recv()
    assert reply["status"] in ("error", "ok")
    # The server is still up, on this connection and for everyone else.
    assert (await c.request(ping_frame("alive")))["op"] == "pong"
    other = await connect(server)
    assert (await other.submit("fine"))["status"] == "ok"
    assert_counters_add_up(await other.stats())


async def test_deadline_exceeded_frees_the_slot(serve: Any, connect: Any) -> None:
    server = serve("--exec-ms", "60000", "--max-inflight", "1")
    c = await connect(server)
    started = time.monotonic()
    reply = await c.submit("x", deadline_ms=150, timeout=30)
    assert (reply["code"], reply["retryable"]) == ("deadline_exceeded", False)
    assert time.monotonic() - started < 30  # at the deadline, long before the execution's end
    spent = await c.submit("y", deadline_ms=0)
    assert spent["code"] == "deadline_exceeded"
    stats = await c.stats()
    assert (stats["inflight"], stats["cancelled_total"], stats["admitted_total"]) == (0, 1, 1)
    assert_counters_add_up(stats)


async def test_disconnect_cancels_work_and_releases_slots(serve: Any, connect: Any) -> None:
    server = serve("--exec-ms", "10000", "--max-inflight", "3")
    leaver, stayer = await connect(server), await connect(server)
    await stayer.send(submit("mine"))
    for i in range(2):
        await leaver.send(submit(f"gone-{i}"))
    await stayer.stats_when(lambda s: s["inflight"] == 3)
    await leaver.aclose()
    stats = await stayer.stats_when(lambda s: s["inflight"] == 1)
    assert stats["cancelled_total"] == 2
    assert_counters_add_up(stats)


async def test_half_close_counts_as_disconnect(serve: Any, connect: Any) -> None:
    server = serve("--exec-ms", "10000")
    c, monitor = await connect(server), await connect(server)
    await c.send(submit("w"))
    await monitor.stats_when(lambda s: s["inflight"] == 1)
    await c.stream.send_eof()
    stats = await monitor.stats_when(lambda s: s["inflight"] == 0)
    assert stats["cancelled_total"] == 1


async def test_streaming_chunks_then_one_terminal_reply(serve: Any, connect: Any) -> None:
    server = serve("--exec-ms", "50")
    c = await connect(server)
    body = "streamed output, piece by piece"
    await c.send(submit("s", body, stream=True, params={"chunks": 5}))
    replies = [await c.recv() for _ in range(6)]
    chunks, terminal = replies[:5], replies[5]
    assert [r["status"] for r in chunks] == ["chunk"] * 5
    assert [r["seq"] for r in chunks] == list(range(5))
    assert "".join(r["data"]["text"] for r in chunks) == body
    assert [r["data"].get("last", False) for r in chunks] == [False] * 4 + [True]
    assert terminal["status"] == "ok"
    assert terminal["result"] == {"text": body, "prompt_tokens": 31, "completion_tokens": 31}


async def test_yields_between_the_chunks_of_a_stream_on_one_connection(
    serve: Any, connect: Any
) -> None:
    # Chunks (written by the submit's own task) and yields (written by the
    # connection's reader) share the connection, and the client reads nothing
    # for a while, so writes block: they must take turns, every line whole.
    server = serve("--max-inflight", "1", "--exec-ms", "1000")
    c = await connect(server)
    # 50 characters or more: the echo sends no empty piece.
    body = "a stream that takes a while, in fifty pieces or more"
    await c.send(submit("s", body, stream=True, params={"chunks": 50}))
    await c.stats_when(lambda s: s["inflight"] == 1)
    ids = [f"{i:06d}" + "y" * 250 for i in range(20_000)]

    async def send_all() -> None:
        for first in range(0, len(ids), 500):
            await c.send(
                b"".join(encode_frame(submit(rid, "")) for rid in ids[first : first + 500])
            )

    statuses: dict[str, list[str]] = {}
    async with anyio.create_task_group() as tg:
        tg.start_soon(send_all)
        await anyio.sleep(0.5)
        for _ in range(50 + 1 + len(ids)):
            reply = await c.recv()
            statuses.setdefault(reply["id"], []).append(reply["status"])
    assert statuses.pop("s") == ["chunk"] * 50 + ["ok"]
    assert statuses == {rid: ["yield"] for rid in ids}


async def test_priority_reservation_end_to_end(serve: Any, connect: Any) -> None:
    server = serve("--max-inflight", "2", "--reserve-high", "1", "--exec-ms", "2000")
    c = await connect(server)
    await c.send(submit("n1"))
    await c.stats_when(lambda s: s["inflight"] == 1)
    assert (await c.submit("n2"))["status"] == "yield"
    assert (await c.submit("lo", priority="low"))["status"] == "yield"
    await c.send(submit("h1", priority="high"))
    await c.stats_when(lambda s: s["inflight"] == 2)
    assert (await c.submit("h2", priority="high"))["status"] == "yield"


async def test_cold_start_then_warm(serve: Any, connect: Any) -> None:
    server = serve("--cold-start-s", "1.0", "--exec-ms", "1")
    c = await connect(server)
    sent = time.monotonic()
    reply = await c.submit("early")
    assert (reply["status"], reply["reason"]) == ("yield", "cold_start")
    assert 1 <= reply["retry_hint_ms"] <= 1000
    stats = await c.stats()
    assert stats["cold"] is True
    await c.stats_when(lambda s: not s["cold"])
    # Truthful: warm no sooner than the hint said (however late a loaded machine is).
    assert time.monotonic() - sent >= reply["retry_hint_ms"] / 1000 - 0.002
    assert (await c.submit("later"))["status"] == "ok"


async def test_bad_input_costs_only_the_sender(serve: Any, connect: Any) -> None:
    """1,000 malformed, oversized and corrupted frames from one client, beside honest work."""
    server = serve("--max-frame-bytes", "2048", "--exec-ms", "20", "--max-inflight", "4")
    honest = await connect(server)
    rng = random.Random(1234)
    sent_bad = {"bad_frame": 0, "integrity_mismatch": 0, "frame_too_large": 0}
    honest_replies: list[dict[str, Any]] = []

    def malformed() -> bytes:
        return rng.choice(
            [
                b"garbage " + bytes(rng.randrange(33, 127) for _ in range(rng.randrange(1, 50))),
                b"\xff\xfe\xfd" + rng.randbytes(20).replace(b"\n", b" "),
                b"[" * 1500,  # too deep for the parser, within the frame limit
                b"[1, 2, 3]",
                b'{"op": "submit", "id": "z"}',
                b'{"op": "submit", "id": "z", "body": "x", "sha256": "nothex"}',
                b"",
            ]
        )

    def corrupted() -> bytes:
        body = "payload " + str(rng.random())
        frame = submit(f"c{rng.random()}", body)
        frame["sha256"] = sha256_hex(body + "!")
        return encode_frame(frame)[:-1]

    async def attacker() -> None:
        c = await RawClient.connect(server)
        try:
            for i in range(1000):
                if i % 10 == 9:  # oversized: the server closes this connection
                    await c.send(b'{"op":"ping","id":"' + b"A" * 4096 + b'"}\n')
                    reply = await c.recv()
                    assert reply["code"] == "frame_too_large"
                    sent_bad["frame_too_large"] += 1
                    await c.aclose()
                    c = await RawClient.connect(server)
                elif i % 3 == 0:
                    await c.send(corrupted() + b"\n")
                    assert (await c.recv())["code"] == "integrity_mismatch"
                    sent_bad["integrity_mismatch"] += 1
                else:
                    await c.send(malformed() + b"\n")
                    reply = await c.recv()
                    assert reply["code"] == "bad_frame", reply
                    sent_bad["bad_frame"] += 1
        finally:
            await c.aclose()

    async def honest_work() -> None:
        for _ in range(30):
            honest_replies.append(await honest.submit("real work"))

    before = await honest.stats()
    async with anyio.create_task_group() as tg:
        tg.start_soon(attacker)
        tg.start_soon(honest_work)
    assert sum(sent_bad.values()) == 1000
    assert all(r["status"] == "ok" for r in honest_replies)
    assert all(r["result"]["text"] == "real work" for r in honest_replies)
    after = await honest.stats_when(lambda s: s["inflight"] == 0)
    assert after["executed_total"] - before["executed_total"] == 30
    assert after["yielded_total"] == before["yielded_total"] == 0
    assert after["cancelled_total"] == after["failed_total"] == 0
    assert after["errors_by_code"] == sent_bad
    assert_counters_add_up(after)


async def test_graceful_shutdown_finishes_admitted_work(serve: Any, connect: Any) -> None:
    server: ServerProcess = serve("--exec-ms", "800", "--grace-s", "10")
    c, late = await connect(server), await connect(server)
    await c.send(submit("admitted"))
    await late.stats_when(lambda s: s["inflight"] == 1)
    server.send_signal(signal.SIGTERM)
    await late.stats_when(lambda s: s["shutting_down"])
    refused = await late.submit("too late")
    assert (refused["code"], refused["retryable"]) == ("shutting_down", True)
    assert (await c.recv_for("admitted"))["status"] == "ok"
    assert await c.closed_by_peer()
    assert await anyio.to_thread.run_sync(server.wait) == 0


async def test_shutdown_past_grace_answers_shutting_down(serve: Any, connect: Any) -> None:
    server: ServerProcess = serve("--exec-ms", "60000", "--grace-s", "0.3")
    c = await connect(server)
    await c.send(submit("forever"))
    await c.stats_when(lambda s: s["inflight"] == 1)
    server.send_signal(signal.SIGINT)
    reply = await c.recv_for("forever")
    assert (reply["code"], reply["retryable"]) == ("shutting_down", True)
    assert await anyio.to_thread.run_sync(server.wait) == 0


async def test_second_signal_stops_at_once(serve: Any, connect: Any) -> None:
    server: ServerProcess = serve("--exec-ms", "60000", "--grace-s", "60")
    c = await connect(server)
    await c.send(submit("forever"))
    await c.stats_when(lambda s: s["inflight"] == 1)
    server.send_signal(signal.SIGTERM)
    await c.stats_when(lambda s: s["shutting_down"])  # the first one was handled
    server.send_signal(signal.SIGTERM)
    reply = await c.recv_for("forever")
    assert reply["code"] == "shutting_down"
    assert await anyio.to_thread.run_sync(server.wait) == 0


async def test_a_full_server_yields_before_it_looks_at_params(serve: Any, connect: Any) -> None:
    server = serve("--max-inflight", "1", "--exec-ms", "400")
    c = await connect(server)
    await c.send(submit("busy"))
    await c.stats_when(lambda s: s["inflight"] == 1)
    # Refusing is the cheap path: a full server yields without validating params...
    assert (await c.submit("x", params={"exec_ms": -1}))["status"] == "yield"
    await c.recv_for("busy")
    # ...which are still checked before any slot is taken.
    assert (await c.submit("x", params={"exec_ms": -1}))["code"] == "backend_error"


def big_submits(n: int, size: int) -> bytes:
    """n submits whose ok replies are large enough to fill the socket buffers."""
    return b"".join(
        encode_frame(submit(f"b{i}", "x" * size, params={"exec_ms": 0})) for i in range(n)
    )


async def test_an_id_is_in_flight_until_its_reply_is_sent(serve: Any, connect: Any) -> None:
    server = serve("--max-inflight", "64", "--exec-ms", "0")
    slow_reader, monitor = await connect(server), await connect(server)
    # Replies pile up unread, so the server cannot finish sending them.
    await slow_reader.send(big_submits(30, 500_000))
    await slow_reader.send(submit("a", params={"exec_ms": 0}))
    # "a" has executed, but its reply waits behind the others.
    await monitor.stats_when(lambda s: s["executed_total"] == 31)
    await slow_reader.send(submit("a", params={"exec_ms": 0}))
    replies = [await slow_reader.recv(timeout=30) for _ in range(32)]
    for_a = sorted(r.get("code", r["status"]) for r in replies if r["id"] == "a")
    assert for_a == ["duplicate_id", "ok"]


async def test_shutdown_never_sends_a_second_terminal_reply(serve: Any, connect: Any) -> None:
    server: ServerProcess = serve("--max-inflight", "64", "--exec-ms", "0", "--grace-s", "0.5")
    slow_reader, monitor = await connect(server), await connect(server)
    await slow_reader.send(big_submits(30, 500_000))
    stats = await monitor.stats_when(lambda s: s["executed_total"] == 30)
    assert stats["inflight"] == 0
    server.send_signal(signal.SIGTERM)
    terminal: dict[str, list[str]] = {}
    with anyio.move_on_after(30):
        while True:
            try:
                reply = await slow_reader.recv(timeout=30)
            except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionError):
                break
            terminal.setdefault(reply["id"], []).append(reply.get("code", reply["status"]))
    # Everything had executed: nobody may be told it did not finish, nor hear twice.
    assert all(len(kinds) == 1 for kinds in terminal.values()), terminal
    assert "shutting_down" not in {kind for kinds in terminal.values() for kind in kinds}
    assert await anyio.to_thread.run_sync(server.wait) == 0


async def test_leaving_after_frame_too_large_still_frees_the_slots(
    serve: Any, connect: Any
) -> None:
    server = serve("--max-inflight", "1", "--max-frame-bytes", "1024", "--exec-ms", "10000")
    victim, monitor = await connect(server), await connect(server)
    await victim.send(submit("work"))
    await monitor.stats_when(lambda s: s["inflight"] == 1)
    await victim.send(b"{" + b" " * 2000)  # too large: the server stops reading frames
    assert (await victim.recv())["code"] == "frame_too_large"
    await victim.aclose()  # ...but still notices the client leave
    stats = await monitor.stats_when(lambda s: s["inflight"] == 0, timeout=3)
    assert stats["cancelled_total"] == 1


async def test_a_lone_surrogate_auth_is_unauthorized(
    serve: Any, connect: Any, tmp_path: Path
) -> None:
    secret = tmp_path / "secret"
    secret.write_text("k")
    c = await connect(serve("--secret-file", str(secret)))
    await c.send(b'{"op":"ping","id":"p1","auth":"\\ud800"}\n')
    reply = await c.recv()
    assert (reply["id"], reply["code"]) == ("p1", "unauthorized")


def test_running_out_of_descriptors_does_not_kill_the_server(serve: Any) -> None:
    def request(sock: socket.socket, line: bytes) -> dict[str, Any]:
        answer: dict[str, Any] = json.loads(send_line(sock, line))
        return answer

    server = serve("--exec-ms", "1", fd_limit=40)
    port = server.port
    socks: list[socket.socket] = []
    try:
        kept = socket.create_connection(("127.0.0.1", port), timeout=10)
        socks.append(kept)
        assert request(kept, b'{"op":"ping","id":"before"}\n')["op"] == "pong"
        for _ in range(60):  # more than the server has descriptors for: the rest wait
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        deadline = time.monotonic() + 30
        while (stats := request(kept, b'{"op":"stats","id":"s"}\n'))["connections_total"] < 20:
            assert time.monotonic() < deadline, stats
            time.sleep(0.02)
        # Out of descriptors (it could not take all 61), alive, and serving what is open.
        assert stats["connections_open"] < 61
        assert request(kept, b'{"op":"ping","id":"during"}\n')["op"] == "pong"
        for sock in socks[1:]:
            sock.close()
        del socks[1:]
        # Descriptors come back, and new connections are accepted again.
        while request(kept, b'{"op":"stats","id":"s"}\n')["connections_open"] > 1:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            assert request(sock, b'{"op":"ping","id":"after"}\n')["op"] == "pong"
        assert server.poll() is None, "the server died"
    finally:
        for sock in socks:
            sock.close()


@pytest.mark.parametrize("rid", ["a", 'quote " and \\ back', "caf\u00e9 \u2603", "\n\t"])
def test_yield_replies_are_encode_yield_byte_for_byte(rid: str) -> None:
    replies = YieldReplies()
    same = Yield(4, YieldReason.SATURATED, 1, 1)
    refusals = [
        Yield(5, YieldReason.SATURATED, 1, 1),
        same,
        same,
        Yield(4, YieldReason.SATURATED, 1, 1),
        Yield(4, YieldReason.SATURATED, 2, 3),
        Yield(4, YieldReason.COLD_START, 2, 3),
        same,
    ]
    for refusal in refusals:
        expected = encode_yield(
            rid,
            retry_hint_ms=refusal.retry_hint_ms,
            inflight=refusal.inflight,
            max_inflight=refusal.max_inflight,
            reason=refusal.reason,
        )
        assert replies.encode(rid, refusal) == expected
        assert replies.encode("other", refusal) == expected.replace(
            encode_frame({"id": rid})[:-2], b'{"id":"other"', 1
        )
