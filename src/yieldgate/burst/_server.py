"""A ``yieldgate serve`` process started by the tool, so each strategy meets a fresh server.

The server is another program here, started the way a user starts it (the
command line, in a child process); the tool never imports the server.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

__all__ = ["ServedProcess", "serve"]


@dataclass
class ServedProcess:
    """A running server: its TCP address, its HTTP address (when asked for), its log."""

    proc: subprocess.Popen[str]
    tcp: tuple[str, int]
    http: tuple[str, int] | None
    stderr: list[str] = field(default_factory=list)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def split_args(args: str | Sequence[str]) -> list[str]:
    return shlex.split(args) if isinstance(args, str) else list(args)


def _address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    if parts.hostname is None or parts.port is None:
        raise RuntimeError(f"server announced an address without a port: {url!r}")
    return parts.hostname, parts.port


@contextlib.contextmanager
def serve(
    args: str | Sequence[str], *, http: bool, ready_timeout_s: float = 120.0
) -> Iterator[ServedProcess]:
    """Run ``yieldgate serve --port 0 --grace-s 0 [--http-port 0] ARGS`` until the block ends.

    ``ARGS`` come last, so they may override the port and grace flags.
    """
    extra = split_args(args)
    cmd = [sys.executable, "-m", "yieldgate", "serve", "--port", "0", "--grace-s", "0"]
    if http and "--http-port" not in extra:
        cmd += ["--http-port", "0"]
    cmd += extra
    expected = 2 if http or "--http-port" in extra else 1
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(  # noqa: S603 - our own interpreter, arguments as a list
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    stderr: list[str] = []
    threading.Thread(target=lambda: stderr.extend(proc.stderr or ()), daemon=True).start()
    lines: list[str] = []

    def read() -> None:
        for _ in range(expected):
            line = proc.stdout.readline() if proc.stdout else ""
            if not line:
                return
            lines.append(line.strip())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(ready_timeout_s)
    urls = [line.removeprefix("listening ") for line in lines if line.startswith("listening ")]
    if len(urls) != expected:
        proc.kill()
        proc.wait()
        reader.join(1)
        said = "".join(stderr).strip().splitlines()[-3:]
        raise RuntimeError(
            f"`yieldgate serve {shlex.join(extra)}` did not start: "
            + (" / ".join(said) if said else f"stdout {lines!r}")
        )
    served = ServedProcess(
        proc=proc,
        tcp=_address(urls[0]),
        http=_address(urls[1]) if len(urls) > 1 else None,
        stderr=stderr,
    )
    try:
        yield served
    finally:
        served.stop()
