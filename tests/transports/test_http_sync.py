"""The sync transport: ``http_client(gate, sync=True)``, for httpx, httpx2 and the official clients.

The same behaviour as the async transport, checked against a real reference
server where one can produce it (yields, streams, a 400, the official sync
clients) and against the library's ``MockTransport`` where only a scripted
body can (a 100 MiB error body, a body that breaks mid-read). Each call runs
in the calling thread through the Gate's sync driver (``call_and_hold_sync``).
"""

from __future__ import annotations

import contextlib
import gc
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import httpx2
import openai
import pytest
from huggingface_hub import InferenceClient

import yieldgate
from tests.conftest import http_stats
from tests.transports.conftest import DrippingUpstream, dripping_upstream
from yieldgate import (
    CallFailedError,
    DeadlineExceededError,
    Gate,
    GatePolicy,
    RetriesExhaustedError,
    RetryPolicy,
    StreamInterruptedError,
    TimeoutPolicy,
    WindowPolicy,
    current_attempt,
    http_client,
)
from yieldgate.server import ServerProcess, spawn
from yieldgate.transports.http import MAX_ERROR_BODY_BYTES

pytestmark = pytest.mark.e2e

CHAT = "/v1/chat/completions"
LIBRARIES = {"httpx": httpx, "httpx2": httpx2}


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with spawn("--max-inflight", "1", "--exec-ms", "10", http=True) as proc:
        yield proc


@pytest.fixture(params=["httpx2", "httpx"])
def flavor(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def one_slot_gate(**retry: Any) -> Gate:
    return Gate(
        GatePolicy(window=WindowPolicy.fixed(1), retry=RetryPolicy(**retry)), name="upstream"
    )


def chat(content: str, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": content}], **extra}


def wait_until(predicate: Callable[[], bool], timeout: float = 15.0) -> None:
    """Poll ``predicate`` (a server's counters, another thread's state) until it holds."""
    done = threading.Event()
    for _ in range(int(timeout / 0.01)):
        if predicate():
            return
        done.wait(0.01)
    raise AssertionError("the condition never held")


class Holder:
    """An ungated request that keeps the server's only slot for ``exec_ms``."""

    def __init__(self, server: ServerProcess, exec_ms: int) -> None:
        self.server = server
        body = chat("hold", backend_params={"exec_ms": exec_ms})
        self.thread = threading.Thread(target=self._run, args=(body,))
        self.status: int | None = None

    def _run(self, body: dict[str, Any]) -> None:
        with httpx.Client(base_url=self.server.http_url or "", timeout=60) as client:
            self.status = client.post(CHAT, json=body).status_code

    def __enter__(self) -> Holder:
        self.thread.start()
        wait_until(lambda: http_stats(self.server)["inflight"] == 1)
        return self

    def __exit__(self, *exc: object) -> None:
        self.thread.join(60)


# -- against the reference server ---------------------------------------------------


def test_a_yield_is_waited_out_and_the_same_body_resent(server: ServerProcess, flavor: str) -> None:
    gate = one_slot_gate()
    yielded = http_stats(server)["yielded_total"]
    with (
        http_client(gate, sync=True, flavor=flavor, base_url=server.http_url) as client,
        Holder(server, exec_ms=1_000),
    ):
        assert isinstance(client, LIBRARIES[flavor].Client)
        response = client.post(CHAT, json=chat("hello"))
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "user: hello"
    statistics = gate.statistics()
    assert statistics.yields >= 1
    assert statistics.window.inflight == 0
    assert http_stats(server)["yielded_total"] > yielded


def test_a_stream_holds_its_slot_until_it_is_closed(server: ServerProcess, flavor: str) -> None:
    gate = one_slot_gate()
    with http_client(gate, sync=True, flavor=flavor, base_url=server.http_url) as client:
        second: list[int] = []

        def call() -> None:
            second.append(client.post(CHAT, json=chat("second")).status_code)

        with client.stream("POST", CHAT, json=chat("first", stream=True)) as response:
            assert response.status_code == 200
            assert gate.statistics().window.inflight == 1
            other = threading.Thread(target=call)
            other.start()
            # The window has one slot and the open stream holds it.
            wait_until(lambda: gate.statistics().window.waiting == 1)
            assert second == []
            lines = [line for line in response.iter_lines() if line.startswith("data:")]
        other.join(30)
    assert lines[-1] == "data: [DONE]"
    assert second == [200]
    assert gate.statistics().window.inflight == 0


def test_giving_up_returns_the_last_response_to_the_client(
    server: ServerProcess, flavor: str
) -> None:
    gate = one_slot_gate()
    # The slot frees in 3 s: a request allowed 1 s stops at once (fail fast).
    client = http_client(gate, sync=True, flavor=flavor, base_url=server.http_url, timeout=1.0)
    with client, Holder(server, exec_ms=3_000):
        response = client.post(CHAT, json=chat("too many"))
    assert response.status_code == 429
    error = response.extensions["yieldgate_error"]
    assert isinstance(error, DeadlineExceededError)
    assert error.last_hint_s is not None
    assert error.last_hint_s > 1.0
    assert gate.statistics().window.inflight == 0


def test_a_fatal_status_is_returned_at_once(server: ServerProcess, flavor: str) -> None:
    gate = one_slot_gate()
    with http_client(gate, sync=True, flavor=flavor, base_url=server.http_url) as client:
        response = client.post(CHAT, json={"model": "m", "messages": "not a list"})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "bad_frame"
    assert isinstance(response.extensions["yieldgate_error"], CallFailedError)
    assert gate.statistics().attempts == 1


def test_each_attempt_goes_to_the_chosen_upstreams_origin(server: ServerProcess) -> None:
    gate = Gate(upstreams={"real": server.http_url or ""}, name="upstreams")
    with http_client(gate, sync=True, base_url="http://placeholder.invalid") as client:
        response = client.post(CHAT, json=chat("routed"))
    assert response.status_code == 200
    assert gate.statistics().upstreams[0].name == "real"


def test_connection_errors_exhaust_into_a_typed_error(flavor: str) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    gate = one_slot_gate(max_attempts=3, base_s=0.01)
    with (
        http_client(gate, sync=True, flavor=flavor) as client,
        pytest.raises(RetriesExhaustedError) as caught,
    ):
        client.get(f"http://127.0.0.1:{port}/")
    assert isinstance(caught.value.__cause__, LIBRARIES[flavor].ConnectError)
    assert gate.statistics().attempts == 3
    assert gate.statistics().window.inflight == 0


def test_a_server_that_never_answers_costs_an_attempt_timeout_not_the_librarys(
    flavor: str,
) -> None:
    # A thread cannot be interrupted: the attempt's time bounds each network wait.
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        accepted: list[socket.socket] = []

        def accept() -> None:
            with contextlib.suppress(OSError):  # the listener closed first
                accepted.append(listener.accept()[0])

        acceptor = threading.Thread(target=accept)
        acceptor.start()
        policy = GatePolicy(
            retry=RetryPolicy(max_attempts=1), timeout=TimeoutPolicy(attempt_s=0.5, total_s=60)
        )
        gate = Gate(policy, name="silent")
        with (
            http_client(gate, sync=True, flavor=flavor, timeout=None) as client,
            pytest.raises(RetriesExhaustedError) as caught,
        ):
            client.get(f"http://127.0.0.1:{port}/", timeout=30.0)
    acceptor.join(10)
    for conn in accepted:
        conn.close()
    assert isinstance(caught.value.__cause__, LIBRARIES[flavor].ReadTimeout)


def test_an_error_body_dripped_slowly_is_cut_at_the_attempts_deadline(
    slow_429: DrippingUpstream, flavor: str
) -> None:
    # Each byte comes well within a read timeout, so only the attempt's own time
    # can stop the read: reading the whole body takes 11 s, the call is allowed 2.
    gate = Gate(GatePolicy(timeout=TimeoutPolicy(total_s=2.0)), name="dripping")
    with http_client(gate, sync=True, flavor=flavor, base_url=slow_429.url) as client:
        started = time.monotonic()
        response = client.post(CHAT, json=chat("hello"))
        elapsed = time.monotonic() - started
    assert elapsed < 5.0
    assert response.status_code == 429  # classified by its status and headers
    assert response.extensions["yieldgate_truncated"] is True
    assert b'{"error": "slow down"}'.startswith(response.content)
    assert isinstance(response.extensions["yieldgate_error"], DeadlineExceededError)
    assert gate.statistics().window.inflight == 0
    # The rest is never read: the connection is closed, not kept for the pool.
    wait_until(lambda: slow_429.closed_early == slow_429.requests == 1)


def test_an_error_body_that_stalls_still_gives_its_status_by_the_deadline() -> None:
    # Nothing of the body comes in time: the read timeout cut to the attempt's
    # time fires, and the status and headers are still what the dialect reads.
    headers = {"content-type": "application/json", "retry-after": "30"}
    gate = Gate(GatePolicy(timeout=TimeoutPolicy(total_s=2.0)), name="stalled")
    with (
        dripping_upstream(b"503 Service Unavailable", headers, b"{}", interval_s=60) as upstream,
        http_client(gate, sync=True, base_url=upstream.url) as client,
    ):
        started = time.monotonic()
        response = client.post(CHAT, json=chat("hello"))
        elapsed = time.monotonic() - started
    assert elapsed < 5.0
    assert (response.status_code, response.content) == (503, b"")
    assert response.extensions["yieldgate_truncated"] is True
    assert gate.statistics().window.inflight == 0


def test_the_sync_openai_client_gets_its_rate_limit_error_by_the_deadline(
    slow_429: DrippingUpstream,
) -> None:
    gate = Gate(GatePolicy(timeout=TimeoutPolicy(total_s=2.0)), name="dripping")
    client = yieldgate.openai_client(
        gate, sync=True, base_url=f"{slow_429.url}/v1", api_key="unused"
    )
    messages: Any = [{"role": "user", "content": "hello"}]
    with client:
        started = time.monotonic()
        with pytest.raises(openai.RateLimitError):
            client.chat.completions.create(model="m", messages=messages)
        elapsed = time.monotonic() - started
    assert elapsed < 5.0  # 2 s allowed; the whole body takes 11 s
    assert gate.statistics().window.inflight == 0


def test_a_non_upstream_error_surfaces_as_the_library_raised_it(flavor: str) -> None:
    gate = one_slot_gate()
    with (
        http_client(gate, sync=True, flavor=flavor) as client,
        pytest.raises(LIBRARIES[flavor].UnsupportedProtocol),
    ):
        client.get("ftp://upstream.test/")
    assert gate.statistics().attempts == 1


# -- the official sync clients ------------------------------------------------------------


def test_the_sync_openai_client_calls_and_streams_through_the_gate(server: ServerProcess) -> None:
    gate = Gate(name="openai")
    with yieldgate.openai_client(
        gate, sync=True, base_url=f"{server.http_url}/v1", api_key="unused"
    ) as client:
        assert isinstance(client, openai.OpenAI)
        messages: Any = [{"role": "user", "content": "hello"}]
        reply = client.chat.completions.create(model="m", messages=messages)
        stream = client.chat.completions.create(model="m", messages=messages, stream=True)
        pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert reply.choices[0].message.content == "user: hello"
    assert "".join(pieces) == "user: hello"
    statistics = gate.statistics()
    assert (statistics.calls_ok, statistics.window.inflight) == (2, 0)


def test_the_sync_huggingface_client_goes_through_the_gate_inside_the_block(
    server: ServerProcess,
) -> None:
    gate = Gate(name="hf")
    client = InferenceClient(model=f"{server.http_url}/models/tiny")
    with yieldgate.huggingface_clients(gate):
        assert client.text_generation("inside", max_new_tokens=16) == "inside"
        tokens = list(client.text_generation("streamed", max_new_tokens=16, stream=True))
    assert "".join(tokens) == "streamed"
    assert client.text_generation("outside", max_new_tokens=16) == "outside"
    assert gate.statistics().calls_ok == 2  # the call after the block went around it


@pytest.mark.parametrize("include_hub", [False, True])
def test_the_hubs_own_requests_go_around_the_gate_unless_asked(
    server: ServerProcess, monkeypatch: pytest.MonkeyPatch, include_hub: bool
) -> None:
    # huggingface_hub sends Hub calls (model info, its background requests) through
    # the same factory: a Hub that cannot be reached must not open the endpoint's
    # breaker. The local server stands in for the Hub here, by another name.
    import huggingface_hub.constants
    from huggingface_hub.utils import get_session

    assert server.http_address is not None
    hub = f"http://localhost:{server.http_address[1]}"
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", hub)
    gate = Gate(name="hf")
    with yieldgate.huggingface_clients(gate, include_hub=include_hub):
        assert get_session().get(f"{hub}/health").status_code == 200
        client = InferenceClient(model=f"{server.http_url}/models/tiny")
        assert client.text_generation("inference", max_new_tokens=16) == "inference"
    assert gate.statistics().calls == (2 if include_hub else 1)


def test_a_thread_pool_shares_one_sync_client_and_the_servers_one_slot(
    server: ServerProcess,
) -> None:
    gate = Gate(GatePolicy(retry=RetryPolicy(max_yields=1000)), name="pool")
    with http_client(gate, sync=True, base_url=server.http_url) as client:

        def call(i: int) -> str:
            response = client.post(CHAT, json=chat(f"hello {i}"))
            response.raise_for_status()
            return str(response.json()["choices"][0]["message"]["content"])

        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(call, range(40)))
    assert results == [f"user: hello {i}" for i in range(40)]
    statistics = gate.statistics()
    assert (statistics.calls_ok, statistics.window.inflight) == (40, 0)


def test_closing_the_client_gives_back_the_slots_of_streams_left_open(
    server: ServerProcess, flavor: str
) -> None:
    gate = Gate(name="upstream")
    client = http_client(gate, sync=True, flavor=flavor, base_url=server.http_url)
    readers = []
    for i in range(2):
        request = client.build_request("POST", CHAT, json=chat(f"left open {i}", stream=True))
        # Kept: the library closes a response whose byte iterator is dropped.
        readers.append(client.send(request, stream=True).iter_bytes())
        assert next(readers[-1])
    assert gate.statistics().window.inflight == 2
    client.close()
    assert gate.statistics().window.inflight == 0
    for reader in readers:  # still referenced until now: the garbage collector freed nothing
        reader.close()
    assert gate.statistics().window.inflight == 0


def test_closing_the_sync_openai_client_gives_back_a_stream_left_open(
    serve: Callable[..., ServerProcess],
) -> None:
    server = serve("--http-port", "0", "--max-inflight", "4", "--exec-ms", "10")
    gate = Gate(name="openai")
    client = yieldgate.openai_client(
        gate, sync=True, base_url=f"{server.http_url}/v1", api_key="unused"
    )
    messages: Any = [{"role": "user", "content": "a reply of several chunks"}]
    stream = client.chat.completions.create(model="m", messages=messages, stream=True)
    for _chunk in stream:
        break  # the caller stops reading and keeps the stream
    assert gate.statistics().window.inflight == 1
    client.close()
    assert gate.statistics().window.inflight == 0
    stream.close()  # closed late: the slot was given back once, not twice
    assert gate.statistics().window.inflight == 0


# -- scripted bodies (the library's MockTransport) -------------------------------------


def mock_client(gate: Gate, flavor: str, handler: Callable[[Any], Any], **kw: Any) -> Any:
    lib = LIBRARIES[flavor]
    return http_client(gate, sync=True, inner=lib.MockTransport(handler), **kw)


def test_a_huge_error_body_is_read_only_up_to_the_cap(flavor: str) -> None:
    lib = LIBRARIES[flavor]
    bodies: list[Endless] = []

    class Endless(lib.SyncByteStream):  # type: ignore[name-defined, misc]
        def __init__(self) -> None:
            self.pulled = 0
            self.closed = False

        def __iter__(self) -> Iterator[bytes]:
            yield b'{"error": {"message": "slow down"}, "pad": "'
            for _ in range(100):
                self.pulled += 1 << 20
                yield b"x" * (1 << 20)

        def close(self) -> None:
            self.closed = True

    def handler(request: Any) -> Any:
        bodies.append(Endless())
        return lib.Response(429, headers={"retry-after-ms": "1"}, stream=bodies[-1])

    gate = Gate(GatePolicy(retry=RetryPolicy(max_yields=1)), name="upstream")
    with mock_client(gate, flavor, handler) as client:
        response = client.post("http://upstream.test/v1/completions", json={})
    assert response.status_code == 429
    assert len(bodies) == 2
    assert all(body.pulled <= 2 * MAX_ERROR_BODY_BYTES and body.closed for body in bodies)
    assert len(response.content) == MAX_ERROR_BODY_BYTES
    assert response.extensions["yieldgate_truncated"] is True


def test_a_body_that_breaks_after_its_first_chunk_is_interrupted_not_retried(
    flavor: str,
) -> None:
    lib = LIBRARIES[flavor]

    class Broken(lib.SyncByteStream):  # type: ignore[name-defined, misc]
        def __iter__(self) -> Iterator[bytes]:
            yield b"data: partial\n\n"
            raise lib.ReadError("connection reset")

    def handler(request: Any) -> Any:
        return lib.Response(200, headers={"content-type": "text/event-stream"}, stream=Broken())

    gate = Gate(GatePolicy(window=WindowPolicy(initial=4, min=1, max=8)), name="upstream")
    with (
        mock_client(gate, flavor, handler) as client,
        pytest.raises(StreamInterruptedError) as caught,
    ):
        client.get("http://upstream.test/stream")
    assert caught.value.chunks == [b"data: partial\n\n"]
    assert isinstance(caught.value.__cause__, lib.ReadError)
    statistics = gate.statistics()
    assert (statistics.attempts, statistics.window.inflight, statistics.window.increases) == (
        1,
        0,
        0,
    )


def test_a_body_that_breaks_before_its_first_chunk_is_retried(flavor: str) -> None:
    lib = LIBRARIES[flavor]

    class Broken(lib.SyncByteStream):  # type: ignore[name-defined, misc]
        def __iter__(self) -> Iterator[bytes]:
            raise lib.ReadError("connection reset")
            yield b""  # pragma: no cover - makes this a generator

    sent: list[Any] = []

    def handler(request: Any) -> Any:
        sent.append(request)
        if len(sent) == 1:
            return lib.Response(200, stream=Broken())
        return lib.Response(200, content=b"whole")

    gate = Gate(GatePolicy(retry=RetryPolicy(base_s=0.01)), name="upstream")
    with mock_client(gate, flavor, handler) as client:
        response = client.get("http://upstream.test/")
    assert response.content == b"whole"
    assert len(sent) == 2
    assert gate.statistics().window.inflight == 0


def test_the_priority_header_sets_the_call_priority_and_is_sent_on(flavor: str) -> None:
    lib = LIBRARIES[flavor]
    seen: list[tuple[str | None, str | None]] = []

    def handler(request: Any) -> Any:
        attempt = current_attempt()
        priority = None if attempt is None else attempt.priority.value
        seen.append((priority, request.headers.get("x-yieldgate-priority")))
        return lib.Response(200, content=b"{}")

    gate = one_slot_gate()
    with mock_client(gate, flavor, handler, dialect="governed-http") as client:
        client.get("http://upstream.test/", headers={"X-Yieldgate-Priority": " High "})
        client.get("http://upstream.test/")
        with pytest.raises(ValueError, match="must be high, normal or low"):
            client.get("http://upstream.test/", headers={"x-yieldgate-priority": "urgent"})
    assert seen == [("high", "high"), ("normal", None)]


def test_governed_http_sends_the_remaining_budget(flavor: str) -> None:
    lib = LIBRARIES[flavor]
    deadlines: list[str | None] = []

    def handler(request: Any) -> Any:
        deadlines.append(request.headers.get("x-yieldgate-deadline-ms"))
        return lib.Response(200, content=json.dumps({"ok": True}).encode())

    gate = Gate(GatePolicy(window=WindowPolicy.fixed(1)), name="upstream")
    with mock_client(gate, flavor, handler, dialect="governed-http") as client:
        client.get("http://upstream.test/")
    with mock_client(gate, flavor, handler, dialect="openai") as client:
        client.get("http://upstream.test/")
    assert deadlines[0] is not None
    assert 0 < int(deadlines[0]) <= 60_000  # the policy's 60 s attempt timeout
    assert deadlines[1] is None


def test_a_response_never_closed_returns_its_slot_when_collected(flavor: str) -> None:
    lib = LIBRARIES[flavor]

    class Body(lib.SyncByteStream):  # type: ignore[name-defined, misc]
        def __iter__(self) -> Iterator[bytes]:
            yield b"x" * 10

    gate = one_slot_gate()
    transport = yieldgate.gate_transport(
        gate, sync=True, inner=lib.MockTransport(lambda request: lib.Response(200, stream=Body()))
    )
    response = transport.handle_request(lib.Request("GET", "http://upstream.test/"))
    assert gate.statistics().window.inflight == 1
    del response
    gc.collect()
    assert gate.statistics().window.inflight == 0
    transport.close()


def test_a_sync_client_inside_async_code_is_refused_unless_allowed(server: ServerProcess) -> None:
    """A sync client called from a thread that runs an event loop (an ``async def`` that
    called openai's sync client by mistake, a Jupyter cell) would block the loop while it
    waits: it raises ``BlockingCallError`` (through openai, as it is) before anything is
    sent, unless the client was made with ``allow_event_loop=True``."""
    import anyio

    gate = Gate(name="refused")
    refused = yieldgate.openai_client(
        gate, sync=True, base_url=f"{server.http_url}/v1", api_key="k"
    )
    allowed = yieldgate.openai_client(
        gate, sync=True, base_url=f"{server.http_url}/v1", api_key="k", allow_event_loop=True
    )

    async def inside_a_loop() -> tuple[BaseException | None, str]:
        caught: BaseException | None = None
        try:
            refused.chat.completions.create(**chat("no"))
        except yieldgate.BlockingCallError as exc:
            caught = exc
        reply = allowed.chat.completions.create(**chat("yes"))
        return caught, str(reply.choices[0].message.content)

    try:
        caught, content = anyio.run(inside_a_loop)
    finally:
        refused.close()
        allowed.close()
    assert isinstance(caught, yieldgate.BlockingCallError)
    assert "yes" in content
    stats = gate.statistics()
    assert stats.attempts == 1  # the refused request took nothing and sent nothing
    assert stats.window.inflight == 0
    with pytest.raises(ValueError, match="sync transports"):
        yieldgate.gate_transport(gate, allow_event_loop=True)
