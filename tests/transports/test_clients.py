"""``huggingface_clients`` across threads: huggingface_hub's factories are process-wide.

Real threads against real servers on loopback: the reference server for
inference calls, a dripping upstream for a download that is still in flight
while another thread enters a block.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from huggingface_hub import InferenceClient
from huggingface_hub.utils import _http as hub_http
from huggingface_hub.utils import get_session

import yieldgate
from tests.transports.conftest import dripping_upstream
from yieldgate import Gate
from yieldgate.server import ServerProcess, spawn
from yieldgate.transports import HubClientsInUseError
from yieldgate.transports._hub_factories import enter_block, exit_block

pytestmark = pytest.mark.e2e

WAIT_S = 30.0


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with spawn("--max-inflight", "4", "--exec-ms", "10", http=True) as proc:
        yield proc


@pytest.fixture(autouse=True)
def _factories_put_back() -> Iterator[None]:
    """Whatever a failing test leaves installed, the next one starts from the same factories."""
    installed = (
        hub_http._GLOBAL_CLIENT_FACTORY,
        hub_http._GLOBAL_ASYNC_CLIENT_FACTORY,
        hub_http._GLOBAL_CLIENT,
    )
    yield
    (
        hub_http._GLOBAL_CLIENT_FACTORY,
        hub_http._GLOBAL_ASYNC_CLIENT_FACTORY,
        hub_http._GLOBAL_CLIENT,
    ) = installed


def generate(server: ServerProcess, prompt: str) -> str:
    client = InferenceClient(model=f"{server.http_url}/models/tiny")
    return client.text_generation(prompt, max_new_tokens=16)


def test_a_block_in_another_thread_is_refused_while_one_is_active(server: ServerProcess) -> None:
    # The order that broke it: A enters, B enters, A exits, B exits. B then put
    # back "what it replaced", A's factory, whose Gate and clients were gone.
    gate_a, gate_b = Gate(name="hf-a"), Gate(name="hf-b")
    a_entered, a_exited, b_done = threading.Event(), threading.Event(), threading.Event()
    refused: list[BaseException] = []
    replies: list[str] = []

    def thread_a() -> None:
        try:
            with yieldgate.huggingface_clients(gate_a):
                a_entered.set()
                b_done.wait(WAIT_S)
                replies.append(generate(server, "from a"))
        finally:
            a_entered.set()
            a_exited.set()

    def thread_b() -> None:
        try:
            with yieldgate.huggingface_clients(gate_b):
                b_done.set()
                a_exited.wait(WAIT_S)
        except RuntimeError as exc:
            refused.append(exc)
        finally:
            b_done.set()

    a = threading.Thread(target=thread_a, name="thread-a")
    b = threading.Thread(target=thread_b, name="thread-b")
    a.start()
    assert a_entered.wait(WAIT_S)
    b.start()
    a.join(WAIT_S)
    b.join(WAIT_S)
    assert not a.is_alive()
    assert not b.is_alive()
    assert len(refused) == 1
    error = refused[0]
    assert isinstance(error, HubClientsInUseError)
    assert isinstance(error, yieldgate.YieldgateError)
    for part in ("gate 'hf-a'", "thread 'thread-a'", "thread 'thread-b'", "process-wide"):
        assert part in str(error)
    # A's block ran as if B had not tried; after it, huggingface_hub's own clients again.
    assert replies == ["from a"]
    assert generate(server, "after both") == "after both"
    assert (gate_a.statistics().calls, gate_b.statistics().calls) == (1, 0)


def test_blocks_nested_in_one_thread_put_back_what_they_replaced_in_order(
    server: ServerProcess,
) -> None:
    outer, inner = Gate(name="outer"), Gate(name="inner")
    with yieldgate.huggingface_clients(outer):
        assert generate(server, "one") == "one"
        with yieldgate.huggingface_clients(inner):
            assert generate(server, "two") == "two"
        assert generate(server, "three") == "three"
    assert generate(server, "four") == "four"
    assert (outer.statistics().calls, inner.statistics().calls) == (2, 1)


def test_blocks_of_one_thread_that_exit_out_of_order_put_back_the_original(
    server: ServerProcess,
) -> None:
    # Two tasks of one event loop: A enters, B enters, A exits, B exits.
    first = yieldgate.huggingface_clients(Gate(name="first"))
    second_gate = Gate(name="second")
    second = yieldgate.huggingface_clients(second_gate)
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert generate(server, "second's") == "second's"  # the block still active
    second.__exit__(None, None, None)
    assert generate(server, "neither") == "neither"
    assert second_gate.statistics().calls == 1


def test_entering_a_block_leaves_a_download_in_another_thread_running() -> None:
    body = bytes(range(65, 65 + 40))
    headers = {"content-type": "application/octet-stream"}
    started, entered = threading.Event(), threading.Event()
    seen: dict[str, Any] = {}

    def download(url: str) -> None:
        # huggingface_hub's own shared client, as hf_hub_download uses it.
        session = seen["session"] = get_session()
        try:
            with session.stream("GET", f"{url}/file.bin") as response:
                chunks = response.iter_bytes()
                first = next(chunks)
                started.set()
                entered.wait(WAIT_S)
                seen["body"] = first + b"".join(chunks)
            seen["after"] = session.get(f"{url}/again").status_code
        except Exception as exc:
            seen["error"] = exc
        finally:
            started.set()

    with dripping_upstream(b"200 OK", headers, body, interval_s=0.02) as upstream:
        downloader = threading.Thread(target=download, args=(upstream.url,))
        downloader.start()
        assert started.wait(WAIT_S)
        with yieldgate.huggingface_clients(Gate(name="hf")):
            entered.set()
            downloader.join(WAIT_S)
            gated = get_session()
    assert "error" not in seen, repr(seen.get("error"))
    assert (seen["body"], seen["after"]) == (body, 200)
    session = seen["session"]
    assert not session.is_closed
    assert gated is not session
    # After the block: the session the others held is the shared one again, and
    # the client the block made is closed (nobody can be handed it any more).
    assert get_session() is session
    assert gated.is_closed


def test_without_huggingface_hubs_internals_the_public_setters_are_used() -> None:
    installed: list[tuple[str, Any]] = []
    closed: list[object] = []

    class Client:
        def close(self) -> None:
            closed.append(self)

    def default_sync() -> None: ...

    def default_async() -> None: ...

    def gated_async() -> None: ...

    hub_http = SimpleNamespace(
        default_client_factory=default_sync, default_async_client_factory=default_async
    )
    hub_module = SimpleNamespace(
        set_client_factory=lambda factory: installed.append(("sync", factory)),
        set_async_client_factory=lambda factory: installed.append(("async", factory)),
    )
    block = enter_block(hub_module, hub_http, "hf", gated_async, Client)
    assert [kind for kind, _ in installed] == ["async", "sync"]
    assert installed[0][1] is gated_async
    made = installed[1][1]()
    assert isinstance(made, Client)
    exit_block(hub_module, hub_http, block)
    assert installed[2:] == [("async", default_async), ("sync", default_sync)]
    assert closed == [made]
