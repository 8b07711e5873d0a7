"""``yieldgate.server.spawn``: a real server process, its addresses, and its end.

Some tests run a stand-in program (``program=``): a few lines of Python that
print ``listening`` lines, or do not, to reach the paths a healthy server never takes.
"""

from __future__ import annotations

import signal
import socket
import sys

import httpx
import pytest

from yieldgate import YieldgateError
from yieldgate.server import ServerProcess, ServerStartError, spawn

# Blocks until killed, without a sleep: nothing will ever set the event.
_FOREVER = "import threading; threading.Event().wait()"


def stand_in(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def refused(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


@pytest.mark.e2e
def test_the_port_is_the_one_the_server_listens_on() -> None:
    with spawn("--max-inflight", "2") as server:
        assert isinstance(server, ServerProcess)
        assert (server.host, server.url) == ("127.0.0.1", f"tcp://127.0.0.1:{server.port}")
        assert server.http_url is None
        assert server.http_address is None
        with socket.create_connection((server.host, server.port), timeout=5) as sock:
            sock.sendall(b'{"op":"stats","id":"s"}\n')
            assert b'"max_inflight":2' in sock.recv(65536)
        assert server.poll() is None


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("args", "http"),
    [((), True), (("--http-port", "0"), False), (("--http-port=0",), False)],
    ids=["http=True", "--http-port 0", "--http-port=0"],
)
def test_an_http_front_is_awaited_and_reported(args: tuple[str, ...], http: bool) -> None:
    with spawn(*args, http=http) as server:
        assert server.http_address is not None
        host, port = server.http_address
        assert server.http_url == f"http://{host}:{port}"
        assert port != server.port
        assert httpx.get(f"{server.http_url}/health", timeout=5).json() == {"status": "ok"}


@pytest.mark.e2e
def test_leaving_the_block_stops_the_server_also_on_an_exception() -> None:
    with pytest.raises(KeyError), spawn() as server:
        raise KeyError("the test body failed")
    assert server.poll() == 0  # SIGTERM: a graceful shutdown
    assert refused(server.host, server.port)
    assert "SIGTERM" in server.stderr


@pytest.mark.e2e
def test_stop_is_graceful_and_can_be_repeated() -> None:
    server = spawn("--grace-s", "0")
    assert server.stop() == 0
    assert server.stop() == 0
    assert server.wait(timeout=0) == 0


@pytest.mark.e2e
def test_a_bad_flag_is_a_typed_error_carrying_stderr() -> None:
    with pytest.raises(ServerStartError, match="--max-inflight must be >= 1") as caught:
        spawn("--max-inflight", "0")
    error = caught.value
    assert isinstance(error, YieldgateError)
    assert error.returncode == 2
    assert "yieldgate serve: error: --max-inflight must be >= 1" in error.stderr
    assert error.command[-2:] == ("--max-inflight", "0")
    assert "exited with status 2" in str(error)


@pytest.mark.e2e
def test_an_unknown_flag_is_a_typed_error_carrying_argparse_usage() -> None:
    with pytest.raises(ServerStartError, match="unrecognized arguments") as caught:
        spawn("--no-such-flag")
    # One line, the command's own, with where to look: not argparse's usage block.
    assert caught.value.stderr == (
        "yieldgate serve: error: unrecognized arguments: --no-such-flag "
        "(see 'yieldgate serve --help')\n"
    )


def test_a_program_that_exits_before_listening() -> None:
    with pytest.raises(ServerStartError, match="no port for you") as caught:
        spawn(program=stand_in("import sys; sys.exit('no port for you')"))
    assert caught.value.returncode == 1
    assert caught.value.stderr == "no port for you\n"


def test_a_silent_program_is_killed_after_the_ready_timeout() -> None:
    with pytest.raises(ServerStartError, match=r"did not listen within 0.5 s") as caught:
        spawn(program=stand_in(_FOREVER), ready_timeout=0.5)
    assert caught.value.returncode is None


def test_stop_kills_a_process_that_ignores_sigterm() -> None:
    code = (
        "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        f"print('listening tcp://127.0.0.1:1', flush=True); {_FOREVER}"
    )
    server = spawn(program=stand_in(code))
    assert server.poll() is None
    assert server.stop(timeout=0.2) == -signal.SIGKILL
    assert server.poll() == -signal.SIGKILL


def test_the_environment_reaches_the_process_and_args_follow_port_zero() -> None:
    code = (
        "import os, sys; "
        "print(' '.join(sys.argv[1:]), file=sys.stderr); "
        "print(f'listening tcp://[::1]:{os.environ[\"STAND_IN_PORT\"]}'); "
        "print('listening http://127.0.0.1:2'); "
        f"{_FOREVER}"
    )
    with spawn("--http-port", "7", program=stand_in(code), env={"STAND_IN_PORT": "4321"}) as server:
        assert (server.host, server.port) == ("::1", 4321)
        assert server.url == "tcp://[::1]:4321"
        assert server.http_address == ("127.0.0.1", 2)
    assert server.stderr == "--port 0 --http-port 7\n"


def test_stderr_left_uncaptured_is_not_collected() -> None:
    code = f"print('listening tcp://127.0.0.1:1', flush=True); {_FOREVER}"
    with spawn(program=stand_in(code), capture_stderr=False) as server:
        assert server.stderr == ""


def test_fd_limit_caps_the_process_descriptors() -> None:
    resource = pytest.importorskip("resource")
    if not hasattr(resource, "prlimit"):
        pytest.skip("prlimit is Linux only")
    code = f"print('listening tcp://127.0.0.1:1', flush=True); {_FOREVER}"
    with spawn(program=stand_in(code), fd_limit=64) as server:
        assert resource.prlimit(server.pid, resource.RLIMIT_NOFILE) == (64, 64)


def test_bad_arguments_to_spawn_itself() -> None:
    with pytest.raises(ValueError, match="ready_timeout"):
        spawn(ready_timeout=0)
    with pytest.raises(ValueError, match="fd_limit"):
        spawn(fd_limit=0)
    with pytest.raises(ServerStartError, match="cannot run") as caught:
        spawn(program=["/nonexistent/yieldgate-serve"])
    assert isinstance(caught.value.__cause__, OSError)
