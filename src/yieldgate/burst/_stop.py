"""``Stop``: why a burst ends before it is through, and the processes it watches meanwhile.

A run is cut short by a signal (Ctrl-C's ``SIGINT``, ``SIGTERM``, ``SIGHUP``:
``Stop.on_signals``) or by the death of a process the tool started (a server of
``--serve``, a worker of ``--workers``), which the runner registers with
``Stop.watching`` for as long as it needs it and polls with ``Stop.check``.
Either way the run ends its current strategy early, keeps what it measured,
marks it incomplete and runs no more strategies; the report says so
(``BurstReport.stopped_by``). A second signal exits at once: the watched
processes are killed first, so none outlives the tool.

A plain object read by the runner between its steps (sans-IO, as the Gate's
decisions are): the signal handler only sets it, from the main thread.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType

__all__ = ["INTERRUPTED_STATUS", "PROCESS_DIED_STATUS", "Stop", "Watched"]

INTERRUPTED_STATUS = 130
"""The exit status of a run cut short by a signal (as a shell reports Ctrl-C)."""
PROCESS_DIED_STATUS = 3
"""The exit status of a run cut short because a process the tool started died."""

_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")
_STDERR_LINES = 3


@dataclass(frozen=True, slots=True)
class Watched:
    """A process the tool started and needs alive: ``poll()`` is its exit status (``None``
    while it runs), ``stderr()`` what it wrote there so far ("" when not captured)."""

    name: str
    pid: int
    poll: Callable[[], int | None]
    stderr: Callable[[], str] = str


class Stop:
    """Whether, and why, a run must end now (module docstring)."""

    def __init__(self) -> None:
        self._set = threading.Event()
        self._lock = threading.Lock()
        self._watched: dict[int, Watched] = {}
        self._signal: str | None = None
        self._died: tuple[Watched, int] | None = None

    def is_set(self) -> bool:
        return self._set.is_set()

    @property
    def status(self) -> int:
        """The exit status the command ends with: 130 for a signal, 3 for a dead process."""
        return PROCESS_DIED_STATUS if self._died is not None else INTERRUPTED_STATUS

    @property
    def reason(self) -> str | None:
        """What cut the run short, in one line (``None``: nothing). A dead process's line
        ends with the last lines of its standard error, read when asked."""
        if self._died is not None:
            watched, code = self._died
            how = f"was killed by {_signal_name(-code)}" if code < 0 else f"exited with {code}"
            tail = [line.strip() for line in watched.stderr().strip().splitlines()]
            said = " / ".join(line for line in tail[-_STDERR_LINES:] if line)
            return f"{watched.name} (pid {watched.pid}) {how}" + (f": {said}" if said else "")
        if self._signal is not None:
            return f"interrupted by {self._signal}"
        return None

    def interrupt(self, name: str) -> None:
        """Cut the run short for the signal ``name`` (``"SIGINT"``); the first cause wins."""
        with self._lock:
            if not self._set.is_set():
                self._signal = name
                self._set.set()

    def check(self) -> bool:
        """Poll the watched processes: the first found dead cuts the run short. ``True``
        once the run must stop, for whatever cause."""
        if not self._set.is_set():
            for watched in list(self._watched.values()):
                code = watched.poll()
                if code is not None:
                    with self._lock:
                        if not self._set.is_set():
                            self._died = (watched, code)
                            self._set.set()
                    break
        return self._set.is_set()

    @contextlib.contextmanager
    def watching(self, *processes: Watched) -> Iterator[None]:
        """Watch ``processes`` while the block runs; leave it before stopping them, so an
        exit the tool asked for is not taken for a death."""
        for watched in processes:
            self._watched[watched.pid] = watched
        try:
            yield
        finally:
            for watched in processes:
                self._watched.pop(watched.pid, None)

    def kill_watched(self) -> None:
        """``SIGKILL`` every watched process still running (the exit at once)."""
        for watched in list(self._watched.values()):
            if watched.poll() is None:
                with contextlib.suppress(OSError):
                    os.kill(watched.pid, signal.SIGKILL)

    @contextlib.contextmanager
    def on_signals(self) -> Iterator[Stop]:
        """Within the block, SIGINT, SIGTERM and SIGHUP cut the run short; a second one
        kills the watched processes and exits with status 130 at once. Main thread only."""

        def handle(signum: int, frame: FrameType | None) -> None:
            if self.is_set():
                self.kill_watched()
                os.write(2, b"yieldgate burst: interrupted again: exiting now\n")
                os._exit(INTERRUPTED_STATUS)
            self.interrupt(_signal_name(signum))

        before = {}
        for name in _SIGNALS:
            signum = getattr(signal, name, None)
            if signum is not None:
                before[signum] = signal.signal(signum, handle)
        try:
            yield self
        finally:
            for signum, old in before.items():
                signal.signal(signum, old)


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
