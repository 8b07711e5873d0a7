"""GovernedClient against real ``yieldgate serve`` processes (and one misbehaving peer)."""

from __future__ import annotations

import contextlib
import functools
import json
import socket
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest

from yieldgate import (
    CallFailedError,
    DeadlineExceededError,
    Gate,
    GateClosedError,
    GatePolicy,
    GovernedClient,
    RemoteError,
    RetriesExhaustedError,
    RetryPolicy,
    StreamInterruptedError,
    TimeoutPolicy,
    TransportError,
    WindowPolicy,
    YieldExhaustedError,
    YieldgateError,
)
from yieldgate.protocol import ProtocolError
from yieldgate.server import spawn
from yieldgate.transports.governed import STREAM_BUFFER

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]


async def eventually(predicate: Any, timeout: float = 5.0) -> None:
    """Poll the server (over the wire: there is no event to wait on) until ``predicate``."""
    with anyio.fail_after(timeout):
        while not await predicate():  # noqa: ASYNC110
            await anyio.sleep(0.02)


async def submit_to_fake_peer(handle: Any, policy: GatePolicy) -> BaseException:
    """Submit once through a client whose 'server' is ``handle``; return what was raised."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, handle)
        async with GovernedClient(f"tcp://127.0.0.1:{port}", gate=Gate(policy)) as client:
            with anyio.fail_after(10), pytest.raises(YieldgateError) as info:
                await client.submit("x")
        tg.cancel_scope.cancel()
    return info.value


async def test_submit_stats_and_ping(serve: Any) -> None:
    server = serve("--exec-ms", "20")
    async with GovernedClient(server.url) as client:
        assert (await client.submit("hello"))["text"] == "hello"
        assert (await client.submit("again", params={"exec_ms": 1}))["text"] == "again"
        stats = await client.stats()
        assert (stats["executed_total"], stats["inflight"]) == (2, 0)
        assert 0 < await client.ping() < 5


async def test_yields_are_ridden_out(serve: Any) -> None:
    server = serve("--max-inflight", "1", "--exec-ms", "100")
    gate = Gate(GatePolicy(window=WindowPolicy(initial=8, max=8)))
    async with GovernedClient(server.url, gate=gate) as client:
        results: list[Any] = []

        async def one(i: int) -> None:
            results.append(await client.submit(f"job {i}"))

        async with anyio.create_task_group() as tg:
            for i in range(8):
                tg.start_soon(one, i)
        stats = await client.stats()
    assert sorted(r["text"] for r in results) == sorted(f"job {i}" for i in range(8))
    assert stats["executed_total"] == 8
    assert stats["yielded_total"] > 0  # the server did push back...
    assert gate.statistics().window.limit < 8  # ...and the window narrowed


async def test_streaming(serve: Any) -> None:
    server = serve("--exec-ms", "40")
    async with GovernedClient(server.url) as client:
        async with client.stream("one two three", params={"chunks": 3}) as chunks:
            pieces = [piece["text"] async for piece in chunks]
        assert "".join(pieces) == "one two three"
        assert chunks.chunks == 3
        assert chunks.result["text"] == "one two three"


async def test_streaming_holds_the_window_slot(serve: Any) -> None:
    server = serve("--exec-ms", "200")
    gate = Gate(GatePolicy(window=WindowPolicy.fixed(1)))
    async with GovernedClient(server.url, gate=gate) as client:
        async with client.stream("x", params={"chunks": 2}) as chunks:
            assert gate.statistics().window.inflight == 1
            async for _ in chunks:
                pass
        assert gate.statistics().window.inflight == 0


async def test_a_stream_that_yields_first_is_retried(serve: Any) -> None:
    server = serve("--max-inflight", "1", "--exec-ms", "300")
    async with GovernedClient(server.url) as client:
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.submit, "occupies the slot")
            await anyio.sleep(0.1)
            async with client.stream("streamed", params={"chunks": 2}) as chunks:
                text = "".join([piece["text"] async for piece in chunks])
        assert text == "streamed"
        assert (await client.stats())["yielded_total"] >= 1


async def test_the_remaining_budget_travels_as_deadline_ms(serve: Any) -> None:
    server = serve("--exec-ms", "10000", "--max-inflight", "2")
    policy = GatePolicy(retry=RetryPolicy(max_attempts=1))
    async with GovernedClient(server.url, gate=Gate(policy)) as client:
        started = time.monotonic()
        with pytest.raises(DeadlineExceededError):
            await client.submit("too slow", timeout=0.5)
        assert time.monotonic() - started < 2

        # The server got the budget too and cancelled the work itself.
        async def cancelled_on_server() -> bool:
            return (await client.stats())["cancelled_total"] == 1

        await eventually(cancelled_on_server)


async def test_attempt_timeout_bounds_the_server_side_deadline(serve: Any) -> None:
    server = serve("--exec-ms", "10000")
    policy = GatePolicy(
        timeout=TimeoutPolicy(attempt_s=0.3, total_s=30), retry=RetryPolicy(max_attempts=2)
    )
    async with GovernedClient(server.url, gate=Gate(policy)) as client:
        with pytest.raises(RetriesExhaustedError):
            await client.submit("slow")

        async def both_cancelled() -> bool:
            stats = await client.stats()
            return bool(stats["cancelled_total"] == 2 and stats["inflight"] == 0)

        await eventually(both_cancelled)


async def test_backend_failures_are_retried_then_reported(serve: Any) -> None:
    server = serve("--exec-ms", "1")
    policy = GatePolicy(retry=RetryPolicy(max_attempts=3, base_s=0.01))
    async with GovernedClient(server.url, gate=Gate(policy)) as client:
        with pytest.raises(RetriesExhaustedError) as info:
            await client.submit("x", params={"fail": True})
        cause = info.value.__cause__
        assert isinstance(cause, RemoteError)
        assert (cause.code, cause.retryable) == ("backend_error", True)
        assert (await client.stats())["failed_total"] == 3


async def test_bad_params_fail_once(serve: Any) -> None:
    server = serve("--exec-ms", "1")
    async with GovernedClient(server.url) as client:
        with pytest.raises(CallFailedError) as info:
            await client.submit("x", params={"exec_ms": -1})
        assert info.value.attempts == 1
        assert isinstance(info.value.__cause__, RemoteError)


async def test_auth(serve: Any, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("s3cret")
    server = serve("--secret-file", str(secret), "--exec-ms", "1")
    async with GovernedClient(server.url, auth="s3cret") as client:
        assert (await client.submit("x"))["text"] == "x"
        assert "inflight" in await client.stats()
    async with GovernedClient(server.url, auth="wrong") as client:
        with pytest.raises(CallFailedError) as info:
            await client.submit("x")
        cause = info.value.__cause__
        assert isinstance(cause, RemoteError)
        assert cause.code == "unauthorized"
        with pytest.raises(RemoteError, match="unauthorized"):
            await client.stats()


async def test_no_server_is_a_typed_error_within_the_deadline() -> None:
    policy = GatePolicy(retry=RetryPolicy(base_s=0.05), timeout=TimeoutPolicy(total_s=2))
    with anyio.fail_after(10):
        async with GovernedClient("tcp://127.0.0.1:9", gate=Gate(policy)) as client:
            with pytest.raises((RetriesExhaustedError, DeadlineExceededError)) as info:
                await client.submit("x")
    assert isinstance(info.value.__cause__, TransportError)


async def test_reconnects_after_the_server_restarts(serve: Any) -> None:
    first = serve("--exec-ms", "1")
    port = first.port
    policy = GatePolicy(retry=RetryPolicy(max_attempts=2, base_s=0.01))
    async with GovernedClient(f"tcp://127.0.0.1:{port}", gate=Gate(policy)) as client:
        assert (await client.submit("before"))["text"] == "before"
        first.stop()
        with pytest.raises(RetriesExhaustedError):
            await client.submit("while down")
        with spawn("--port", str(port), "--exec-ms", "1"):
            assert (await client.submit("after"))["text"] == "after"


async def test_client_misuse_is_a_clear_error() -> None:
    client = GovernedClient("tcp://127.0.0.1:1")
    with pytest.raises(GateClosedError, match="async with"):
        await client.submit("x")
    with pytest.raises(ValueError, match="tcp://"):
        GovernedClient("http://127.0.0.1:1")
    with pytest.raises(ValueError, match="port"):
        GovernedClient("tcp://127.0.0.1")
    with pytest.raises(ValueError, match="connect_timeout"):
        GovernedClient("tcp://127.0.0.1:1", connect_timeout=0)
    async with GovernedClient("tcp://127.0.0.1:1") as used:
        pass
    with pytest.raises(GateClosedError, match="closed"):
        await used.submit("x")
    with pytest.raises(GateClosedError, match="only once"):
        async with used:
            pass


async def test_a_garbling_server_is_a_protocol_error() -> None:
    """A peer that answers nonsense: the client fails typed, retries, never hangs."""
    replies: list[bytes] = []

    async def handle(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            await stream.receive()
            await stream.send(b"this is not json\n")
            replies.append(b"sent")

    policy = GatePolicy(retry=RetryPolicy(max_attempts=3, base_s=0.01))
    error = await submit_to_fake_peer(handle, policy)
    assert isinstance(error, RetriesExhaustedError)
    assert isinstance(error.__cause__, ProtocolError)
    assert len(replies) == 3


async def test_burst_of_400_through_one_gate(serve: Any) -> None:
    """The issue's end-to-end check: 400 at once against max_inflight 8, 50 ms each."""
    server = serve("--max-inflight", "8", "--exec-ms", "50")
    gate = Gate(GatePolicy(window=WindowPolicy(initial=2, max=64)))
    results: list[Any] = []
    async with GovernedClient(server.url, gate=gate) as client:
        started = time.monotonic()

        async def one(i: int) -> None:
            results.append(await client.submit(f"r{i}"))

        async with anyio.create_task_group() as tg:
            for i in range(400):
                tg.start_soon(one, i)
        makespan = time.monotonic() - started
        stats = await client.stats()
    lower_bound = 400 * 0.050 / 8
    attempts = stats["executed_total"] + stats["yielded_total"]
    print(
        f"\n400-burst: makespan {makespan:.2f} s = {makespan / lower_bound:.2f}x the lower bound "
        f"{lower_bound:.2f} s; {attempts / 400:.2f} attempts per request "
        f"({stats['yielded_total']} yields)"
    )
    assert len(results) == 400
    assert stats["executed_total"] == 400
    assert stats["inflight_peak"] <= 8
    assert attempts / 400 <= 2.0


def test_a_client_can_be_built_outside_an_event_loop(serve: Any) -> None:
    server = serve("--exec-ms", "1")
    client = GovernedClient(server.url)  # at import time, say

    async def use() -> Any:
        async with client:
            return await client.submit("x", timeout=None)

    assert anyio.run(use)["text"] == "x"


async def test_gate_map_over_client_submit(serve: Any) -> None:
    """The natural batch idiom: the client's own Gate maps its own submit."""
    server = serve("--max-inflight", "2", "--exec-ms", "30")
    gate = Gate(GatePolicy.cold_start(max_concurrency=8))
    async with GovernedClient(server.url, gate=gate) as client:
        with anyio.fail_after(30):
            results = await gate.map(client.submit, [f"p{i}" for i in range(20)])
        stats = await client.stats()
    assert [r["text"] for r in results] == [f"p{i}" for i in range(20)]
    assert stats["executed_total"] == 20


async def test_an_oversized_body_fails_once_and_harms_nobody(serve: Any) -> None:
    server = serve("--max-frame-bytes", "1000", "--exec-ms", "200")
    gate = Gate()
    async with GovernedClient(server.url, gate=gate, max_frame_bytes=1000) as client:
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.submit, "small and fine")
            await anyio.sleep(0.05)
            with pytest.raises(CallFailedError, match="exceeds max_frame_bytes") as info:
                await client.submit("x" * 2000)
        assert info.value.attempts == 1
        stats = gate.statistics()
        assert (stats.breaker, stats.failures) == ("closed", 1)
        assert (await client.submit("still fine"))["text"] == "still fine"


async def test_a_frame_too_large_reply_drains_the_connection(serve: Any) -> None:
    """If the server's limit is lower than the client's, the connection drains, nothing breaks."""
    server = serve("--max-frame-bytes", "1000", "--exec-ms", "200")
    policy = GatePolicy(retry=RetryPolicy(max_attempts=2, base_s=0.01))
    async with GovernedClient(server.url, gate=Gate(policy)) as client:
        results: list[Any] = []

        async def small() -> None:
            results.append(await client.submit("small"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(small)
            await anyio.sleep(0.05)
            with pytest.raises((RetriesExhaustedError, TransportError)):
                await client.submit("x" * 2000)
        assert [r["text"] for r in results] == ["small"]  # the admitted one was still answered
        assert (await client.submit("after"))["text"] == "after"  # on a new connection


async def test_a_reply_the_decoder_chokes_on_stays_inside_the_client() -> None:
    async def handle(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            line = await stream.receive()
            rid = line.split(b'"id":"')[1].split(b'"')[0]
            await stream.send(
                b'{"id":"' + rid + b'","status":"ok","result":1,"exec_ms":' + b"9" * 400 + b"}\n"
            )
            await anyio.sleep(1)

    error = await submit_to_fake_peer(handle, GatePolicy(retry=RetryPolicy(max_attempts=1)))
    assert isinstance(error, RetriesExhaustedError)
    assert isinstance(error.__cause__, ProtocolError)


async def test_aclose_from_another_task(serve: Any) -> None:
    server = serve("--exec-ms", "1")
    async with GovernedClient(server.url) as client:
        assert (await client.submit("x"))["text"] == "x"
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.aclose)
        with pytest.raises(GateClosedError):
            await client.submit("y")


async def test_a_stream_outlives_the_attempt_timeout(serve: Any) -> None:
    server = serve("--exec-ms", "3000")
    policy = GatePolicy(timeout=TimeoutPolicy(attempt_s=1.0, total_s=None))
    async with (
        GovernedClient(server.url, gate=Gate(policy)) as client,
        client.stream("abcd", params={"chunks": 4}) as chunks,
    ):
        pieces = [piece["text"] async for piece in chunks]
    assert "".join(pieces) == "abcd"


def test_remote_errors_keep_the_servers_flag() -> None:
    from yieldgate.protocol import ErrorReply
    from yieldgate.transports._governed_outcome import classify_error

    outcome = classify_error(
        ErrorReply(id="a", code="deadline_exceeded", message="late", retryable=False)
    )
    assert outcome.kind == "retryable"  # the client may try again...
    assert isinstance(outcome.error, RemoteError)
    assert outcome.error.retryable is False  # ...but the error says what the server said


async def test_submit_inside_a_gate_call_sends_that_calls_priority(serve: Any) -> None:
    # One slot for anyone, one reserved for high: while a low submit runs, only high is admitted.
    server = serve("--max-inflight", "2", "--reserve-high", "1", "--exec-ms", "50")
    gate = Gate(GatePolicy(retry=RetryPolicy.no_retry()))
    async with GovernedClient(server.url, gate=gate) as client, anyio.create_task_group() as tg:
        backlog = functools.partial(
            client.submit, "backlog", priority="low", params={"exec_ms": 20000}
        )
        tg.start_soon(backlog)
        await eventually(lambda: _inflight_is(client, 1))
        # gate.map/gate.call place the call by their priority; submit inherits it.
        assert (await gate.call(client.submit, "urgent", priority="high"))["text"] == "urgent"
        with pytest.raises(YieldExhaustedError):
            await gate.call(client.submit, "routine", priority="normal")
        with pytest.raises(YieldExhaustedError):  # an explicit priority is sent as given
            await gate.call(
                functools.partial(client.submit, "explicit", priority="low"), priority="high"
            )
        tg.cancel_scope.cancel()  # the backlog: cancelled on the server when we leave


async def _inflight_is(client: GovernedClient, n: int) -> bool:
    return bool((await client.stats())["inflight"] == n)


# -- issue 16: abandoned work, flow control, hostile peers -------------------------------


async def test_item6_an_absurd_tcp_hint_is_clamped_not_an_overflow() -> None:
    # retry_hint_ms of 10**400 raised OverflowError inside the client: a fatal
    # CallFailedError, where a clamped hint (past the deadline) fails fast.
    async def handle(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            line = (await stream.receive()).split(b"\n")[0]
            rid = json.loads(line)["id"]
            hint = "1" + "0" * 400
            await stream.send(
                b'{"id":"%s","status":"yield","retry_hint_ms":%s,"inflight":1,'
                b'"max_inflight":1,"reason":"saturated"}\n' % (rid.encode(), hint.encode())
            )
            with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError):
                await stream.receive()

    started = time.monotonic()
    error = await submit_to_fake_peer(handle, GatePolicy(timeout=TimeoutPolicy(total_s=5)))
    assert isinstance(error, DeadlineExceededError), error
    assert "asked to wait" in str(error) or "would pass the call's deadline" in str(error)
    assert time.monotonic() - started < 2


async def test_item11_a_cancelled_submit_is_cancelled_on_the_server(serve: Any) -> None:
    # Cancelling a submit only dropped the client's waiter: the server ran it to the
    # end, counted executed, while the client's window counted the slot free.
    server = serve("--exec-ms", "10000", "--max-inflight", "2")
    gate = Gate(GatePolicy(window=WindowPolicy.fixed(2)))
    async with GovernedClient(server.url, gate=gate) as client:
        with anyio.move_on_after(0.3):
            await client.submit("abandoned")
        assert gate.statistics().window.inflight == 0

        async def freed_on_the_server() -> bool:
            stats = await client.stats()
            return bool(stats["inflight"] == 0 and stats["cancelled_total"] == 1)

        await eventually(freed_on_the_server, timeout=5)
        stats = await client.stats()
        assert (stats["executed_total"], stats["connections_open"]) == (0, 1)
        # The same connection goes on serving.
        assert (await client.submit("next", params={"exec_ms": 1}))["text"] == "next"


async def test_item11_leaving_a_stream_early_cancels_the_rest_on_the_server(serve: Any) -> None:
    server = serve("--exec-ms", "10000", "--max-inflight", "1")
    async with GovernedClient(server.url) as client:
        async with client.stream("a long answer", params={"chunks": 1000}) as chunks:
            async for _ in chunks:
                break  # the caller has seen enough

        async def freed_on_the_server() -> bool:
            stats = await client.stats()
            return bool(stats["inflight"] == 0 and stats["cancelled_total"] == 1)

        await eventually(freed_on_the_server, timeout=5)
        # The only slot is free again for the next caller, at once.
        assert (await client.submit("next", params={"exec_ms": 1}))["text"] == "next"


async def test_item11_a_stream_carries_the_calls_deadline(serve: Any) -> None:
    # Streams sent no deadline_ms: a stream whose caller's budget ran out ran on.
    server = serve("--exec-ms", "10000")
    async with GovernedClient(server.url) as client:

        async def read_to_the_end() -> None:
            async with client.stream("x" * 1000, params={"chunks": 1000}, timeout=1.0) as chunks:
                async for _ in chunks:
                    pass

        started = time.monotonic()
        with anyio.fail_after(8), pytest.raises(StreamInterruptedError) as info:
            await read_to_the_end()
        assert "deadline_exceeded" in str(info.value)
        assert time.monotonic() - started < 5
        assert (await client.stats())["inflight"] == 0


async def test_item12_a_paused_consumer_buffers_a_bounded_number_of_chunks(serve: Any) -> None:
    # The client buffered chunks without bound (500,000 while the consumer paused),
    # so TCP's backpressure never reached the server.
    server = serve("--exec-ms", "300")
    async with (
        GovernedClient(server.url) as client,
        client.stream("y" * 10_000, params={"chunks": 10_000}) as chunks,
    ):
        await anyio.sleep(1.0)  # the server has sent everything it could meanwhile
        buffered = chunks._receive.statistics().current_buffer_used
        assert buffered <= STREAM_BUFFER
        pieces = [piece["text"] async for piece in chunks]
    assert len(pieces) == 10_000  # nothing was lost to the bound


async def test_item13_a_draining_connection_is_closed_once_its_work_is_answered() -> None:
    # Against a server that answers frame_too_large and keeps the connection open,
    # 200 calls left 200 connections open.
    open_connections = 0

    async def handle(stream: anyio.abc.SocketStream) -> None:
        nonlocal open_connections
        open_connections += 1
        try:
            async with stream:
                while True:
                    await stream.receive()
                    await stream.send(
                        b'{"id":null,"status":"error","code":"frame_too_large",'
                        b'"message":"too large","retryable":false}\n'
                    )
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass
        finally:
            open_connections -= 1

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    policy = GatePolicy(
        retry=RetryPolicy(max_attempts=1), timeout=TimeoutPolicy(attempt_s=0.05, total_s=5)
    )
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, handle)
        async with GovernedClient(f"tcp://127.0.0.1:{port}", gate=Gate(policy)) as client:
            for i in range(50):
                with pytest.raises(YieldgateError):
                    await client.submit(f"call {i}")
            with anyio.fail_after(5):
                while open_connections > 1:  # noqa: ASYNC110 - a count, no event to wait on
                    await anyio.sleep(0.01)
        tg.cancel_scope.cancel()


async def test_a_connection_that_does_not_open_in_connect_timeout_is_a_transport_error() -> None:
    # A listener that never accepts, its backlog full: the kernel drops further
    # handshakes, so the client's connect hangs until connect_timeout ends it.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        host, port = listener.getsockname()
        queued = []
        try:
            for _ in range(8):  # more than any backlog of 0 holds
                sock = socket.socket()
                sock.setblocking(False)
                with contextlib.suppress(BlockingIOError):
                    sock.connect((host, port))
                queued.append(sock)
            gate = Gate(GatePolicy(retry=RetryPolicy.no_retry()))
            started = time.monotonic()
            async with GovernedClient(
                f"tcp://{host}:{port}", gate=gate, connect_timeout=0.3
            ) as client:
                with pytest.raises(RetriesExhaustedError) as caught:
                    await client.submit("x")
            assert isinstance(caught.value.__cause__, TransportError)
            assert "connect_timeout=0.3 s" in str(caught.value.__cause__)
            assert 0.3 <= time.monotonic() - started < 5
        finally:
            for sock in queued:
                sock.close()
