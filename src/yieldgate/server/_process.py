"""A reference server in a child process: ``spawn`` starts it, ``ServerProcess`` is the handle.

``spawn(*args)`` runs ``python -m yieldgate serve --port 0 ARGS`` with this
interpreter, waits for the ``listening URL`` line of each front (TCP, then HTTP
with ``--http-port``) and returns a handle that knows the real addresses. The
handle is a context manager: leaving the block stops the process, also when
the block raises. A process that exits, or stays silent past
``ready_timeout``, before it listens is a ``ServerStartError`` carrying what it
wrote to standard error (argparse's complaint about a bad flag, a traceback).

Only the standard library is imported here: the server runs in the child.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import IO
from urllib.parse import urlsplit

from yieldgate._exceptions import YieldgateError

__all__ = ["ServerProcess", "ServerStartError", "spawn"]

_LISTENING = "listening "
# Once the process has exited, how long its pipes may take to reach end of file
# (a grandchild that inherited them, such as a prefill worker, holds them open).
_DRAIN_WAIT_S = 5.0


class ServerStartError(YieldgateError):
    """The server process did not report that it listens.

    It exited first (``returncode`` is its exit status) or stayed silent past
    the ready timeout (``returncode`` is ``None``; it was killed). ``stderr``
    is what it wrote to standard error, empty when that was not captured;
    ``command`` is the command line that was run.
    """

    def __init__(
        self,
        message: str,
        *,
        command: Sequence[str],
        returncode: int | None,
        stderr: str,
    ) -> None:
        super().__init__(message)
        self.command = tuple(command)
        """The command line that was run."""
        self.returncode = returncode
        """The process's exit status; ``None``: it stayed silent and was killed."""
        self.stderr = stderr
        """What it wrote to standard error (empty when that was not captured)."""


class _Lines:
    """Reads a text pipe to its end on a thread of its own, so the child never blocks on it.

    ``on_line`` sees every line as it arrives, ``on_end`` runs at the end of the pipe.
    """

    def __init__(
        self,
        pipe: IO[str],
        on_line: Callable[[str], None] | None = None,
        on_end: Callable[[], None] | None = None,
    ) -> None:
        self.lines: list[str] = []
        self._pipe = pipe
        self._on_line = on_line
        self._on_end = on_end
        self._done = threading.Event()
        threading.Thread(target=self._read, daemon=True, name="yieldgate-server-pipe").start()

    def _read(self) -> None:
        try:
            for line in self._pipe:
                self.lines.append(line)
                if self._on_line is not None:
                    self._on_line(line)
        except (OSError, ValueError):  # closed under us: nothing more to read
            pass
        finally:
            self._done.set()
            if self._on_end is not None:
                self._on_end()

    def text(self) -> str:
        return "".join(list(self.lines))

    def close(self, timeout: float) -> None:
        """Wait up to ``timeout`` for the end of the pipe, then close it if it came."""
        if self._done.wait(timeout):
            self._pipe.close()


class ServerProcess:
    """A running ``yieldgate serve`` process, as ``spawn`` returns it.

    ``host`` and ``port`` are where the TCP front listens (``url`` is
    ``tcp://HOST:PORT``); with an HTTP front, ``http_address`` is its
    ``(host, port)`` and ``http_url`` its ``http://HOST:PORT``. ``stop`` ends
    the process (``SIGTERM``, then ``SIGKILL``); so does leaving a ``with``
    block, also on an exception.
    """

    def __init__(
        self,
        process: subprocess.Popen[str],
        urls: Sequence[str],
        stdout: _Lines,
        stderr: _Lines | None,
    ) -> None:
        self._process = process
        self._stdout = stdout
        self._stderr = stderr
        self.url = urls[0]
        """Where the TCP front listens: ``tcp://HOST:PORT``."""
        self.host, self.port = _address(urls[0])
        self.http_url: str | None = urls[1] if len(urls) > 1 else None
        """Where the HTTP front listens, ``http://HOST:PORT``; ``None`` without one."""
        self.http_address = None if self.http_url is None else _address(self.http_url)
        """The HTTP front's ``(host, port)``; ``None`` without one."""

    @property
    def pid(self) -> int:
        """The process's id."""
        return self._process.pid

    @property
    def stderr(self) -> str:
        """What the process has written to standard error so far ("" when not captured).

        Complete once ``stop`` or ``wait`` has returned.
        """
        return "" if self._stderr is None else self._stderr.text()

    def poll(self) -> int | None:
        """The exit status, or ``None`` while the process runs."""
        return self._process.poll()

    def send_signal(self, signum: int) -> None:
        """Send ``signum`` (``signal.SIGTERM`` asks for a graceful shutdown)."""
        if self._process.poll() is None:
            self._process.send_signal(signum)

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the process to exit and return its status; ``TimeoutError`` past ``timeout``."""
        try:
            returncode = self._process.wait(timeout)
        except subprocess.TimeoutExpired as exc:
            raise TimeoutError(f"server process {self.pid} still runs after {timeout} s") from exc
        self._drain()
        return returncode

    def stop(self, timeout: float = 10.0) -> int:
        """Ask the server to stop (``SIGTERM``); kill it if it still runs after ``timeout``.

        Returns its exit status. Stopping a stopped server does nothing more.
        """
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout)
            except subprocess.TimeoutExpired:
                self._process.kill()
        return self.wait()

    def _drain(self) -> None:
        for lines in (self._stdout, self._stderr):
            if lines is not None:
                lines.close(_DRAIN_WAIT_S)

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        urls = self.url if self.http_url is None else f"{self.url} {self.http_url}"
        return f"<ServerProcess pid={self.pid} {urls} returncode={self.poll()}>"


def spawn(
    *args: str,
    http: bool = False,
    ready_timeout: float = 60.0,
    capture_stderr: bool = True,
    env: Mapping[str, str] | None = None,
    fd_limit: int | None = None,
    program: Sequence[str] | None = None,
    new_session: bool = False,
) -> ServerProcess:
    """Start ``yieldgate serve --port 0 ARGS`` in a child process; return once it listens.

    >>> with spawn("--max-inflight", "1", http=True) as server:  # doctest: +SKIP
    ...     print(server.url, server.http_url)
    tcp://127.0.0.1:40411 http://127.0.0.1:38139

    ``ARGS`` are ``yieldgate serve`` flags; they come after ``--port 0`` (and
    the ``--http-port 0`` that ``http=True`` adds unless ``ARGS`` name a
    port), so they may override either. With an HTTP front, both
    ``listening`` lines are awaited, for at most ``ready_timeout`` seconds in
    all.

    The process runs this interpreter with ``PYTHONUNBUFFERED=1`` in an
    environment of ``os.environ`` updated with ``env``. Its standard error is
    collected (``ServerProcess.stderr``) unless ``capture_stderr`` is false,
    when it goes where this process's goes. ``fd_limit`` caps its open file
    descriptors (``RLIMIT_NOFILE``, POSIX only), to see it run out of them.
    ``program`` replaces ``python -m yieldgate serve`` with another command
    that takes ``--port`` and prints ``listening URL`` lines the same way (a
    stand-in server for a benchmark). ``new_session`` starts it in a session (and
    process group) of its own, so that a Ctrl-C at the terminal reaches only the
    caller, which then stops it in its own time.

    Raises ``ServerStartError`` when the process exits, or ``ready_timeout``
    passes, before it listens.
    """
    if not ready_timeout > 0:
        raise ValueError(f"ready_timeout must be > 0, got {ready_timeout}")
    if fd_limit is not None and fd_limit < 1:
        raise ValueError(f"fd_limit must be >= 1, got {fd_limit}")
    serve = list(program) if program is not None else [sys.executable, "-m", "yieldgate", "serve"]
    command = [*serve, "--port", "0"]
    http_port = any(arg == "--http-port" or arg.startswith("--http-port=") for arg in args)
    if http and not http_port:
        command += ["--http-port", "0"]
    command += args
    expected = 2 if http or http_port else 1

    urls: list[str] = []
    settled = threading.Event()  # every front listens, or stdout ended (the process exits)

    def on_line(line: str) -> None:
        if line.startswith(_LISTENING) and len(urls) < expected:
            urls.append(line.removeprefix(_LISTENING).strip())
            if len(urls) == expected:
                settled.set()

    try:
        process = subprocess.Popen(  # noqa: S603 - a list of arguments, no shell
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE if capture_stderr else None,
            text=True,
            env={**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"},
            preexec_fn=None if fd_limit is None else _limit_descriptors(fd_limit),
            start_new_session=new_session,
        )
    except OSError as exc:
        raise ServerStartError(
            f"cannot run {shlex.join(command)}: {exc}", command=command, returncode=None, stderr=""
        ) from exc
    assert process.stdout is not None
    stdout = _Lines(process.stdout, on_line, settled.set)
    stderr = None if process.stderr is None else _Lines(process.stderr)
    started = False
    try:
        settled.wait(ready_timeout)
        # Read once: a line may still arrive now, after the timeout.
        started = len(urls) == expected
        if started:
            return ServerProcess(process, urls, stdout, stderr)
        returncode = None
        if settled.is_set():  # its stdout closed: it is exiting
            with contextlib.suppress(subprocess.TimeoutExpired):
                returncode = process.wait(_DRAIN_WAIT_S)
    finally:
        if not started:  # it did not listen, or we were interrupted while waiting
            _kill(process, stdout, stderr)
    said = "" if stderr is None else stderr.text()
    shown = shlex.join(command if program is not None else ["yieldgate", *command[3:]])
    what = (
        f"it did not listen within {ready_timeout:g} s"
        if returncode is None
        else f"it exited with status {returncode}"
    )
    last = said.strip().splitlines()[-3:]
    raise ServerStartError(
        f"`{shown}` did not start: {what}: "
        + (" / ".join(last) if last else "(nothing on stderr)"),
        command=command,
        returncode=returncode,
        stderr=said,
    )


def _kill(process: subprocess.Popen[str], *pipes: _Lines | None) -> None:
    """Kill a process that did not start (there is nothing to finish) and read what it said."""
    if process.poll() is None:
        process.kill()
    process.wait()
    for lines in pipes:
        if lines is not None:
            lines.close(_DRAIN_WAIT_S)


def _limit_descriptors(limit: int) -> Callable[[], None]:
    def limit_descriptors() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    return limit_descriptors


def _address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    if parts.hostname is None or parts.port is None:
        raise ValueError(f"not a HOST:PORT address: {url!r}")
    return parts.hostname, parts.port
