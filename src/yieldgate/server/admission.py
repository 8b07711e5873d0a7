"""Admission and execution, shared by every front.

A front decodes a request in its own wire format, then hands it here:
``Admission.admit`` decides (refused with an error, yielded, or admitted
into a slot) and ``Admission.execute`` runs admitted work under its deadline
and releases the slot exactly once, with the outcome that fits. The TCP and
HTTP fronts share one ``Admission`` over one Governor and backend, so their
clients compete for the same slots and are counted in the same counters.

Order of checks, cheapest first: shutting down, a deadline already spent,
``Governor.refuse`` (cold or full: yield without looking at the work any
further), the backend's ``estimate_ms`` (bad parameters cost no slot), and
finally ``Governor.try_acquire``.

With a queue (``GovernorConfig.max_queued``), ``admit`` may hand back work
whose slot is still waiting; ``execute`` then waits for the slot first,
under the same deadline (the client's budget counts from arrival), and a
caller cancelled while it waits (the client left, a cancel frame) withdraws
it from the queue. Without one, nothing here ever waits for a slot.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio

from yieldgate.protocol import ErrorCode, Priority
from yieldgate.server.backends import Backend, BackendError, Emit, Work
from yieldgate.server.governor import Governor, Slot, Yield

__all__ = ["Admission", "Admitted", "Failure", "Finish", "Outstanding"]

log = logging.getLogger("yieldgate.server")

R = TypeVar("R")

Finish = Callable[[Any, Slot], Awaitable[R]]
"""Turns a backend result into a front's reply while the slot is still held."""

_MAX_MESSAGE = 512


@dataclass(slots=True, kw_only=True)
class Failure:
    """Work that ends in an ``error`` reply; the front renders and counts it.

    ``retryable`` is ``None`` when the code's default applies. ``invalid``
    marks work the backend refused before admission (its parameters): the
    client's mistake, not the server's (HTTP answers 400, not 500).
    """

    code: ErrorCode
    message: str
    retryable: bool | None = None
    invalid: bool = False


@dataclass(slots=True, kw_only=True)
class Admitted:
    """Work that holds a slot: pass it to ``Admission.execute`` (exactly once)."""

    work: Work
    slot: Slot
    deadline_ms: int | None


class Outstanding:
    """How many admitted requests a front has not answered yet, and a wait for none.

    A front calls ``add`` when it admits work and ``done`` once the work's
    terminal reply is out; a graceful shutdown awaits ``wait_idle``.
    """

    __slots__ = ("_count", "_idle")

    def __init__(self) -> None:
        self._count = 0
        self._idle: anyio.Event | None = None

    def add(self) -> None:
        self._count += 1

    def done(self) -> None:
        self._count -= 1
        if self._count == 0 and self._idle is not None:
            self._idle.set()
            self._idle = None

    async def wait_idle(self) -> None:
        if self._count == 0:
            return
        if self._idle is None:
            self._idle = anyio.Event()
        await self._idle.wait()


class Admission:
    """The front-independent half of a submit, for one Governor and backend."""

    __slots__ = ("backend", "governor")

    def __init__(self, governor: Governor, backend: Backend) -> None:
        self.governor = governor
        """The Governor that admits or yields each submit."""
        self.backend = backend
        """The backend that executes what it admits."""

    def admit(
        self,
        request_id: str,
        body: str,
        *,
        params: Mapping[str, Any],
        priority: Priority = Priority.NORMAL,
        stream: bool = False,
        deadline_ms: int | None = None,
    ) -> Admitted | Yield | Failure:
        """Admit now (or queue, when the Governor has a queue), yield, or refuse; never
        waits. A ``Yield`` is already counted."""
        gov = self.governor
        if gov.shutting_down:
            return Failure(
                code=ErrorCode.SHUTTING_DOWN,
                message="server is shutting down; retry elsewhere or later",
            )
        if deadline_ms is not None and deadline_ms <= 0:
            return Failure(
                code=ErrorCode.DEADLINE_EXCEEDED,
                message="deadline_ms <= 0: the client's budget was spent before arrival",
            )
        refusal = gov.refuse(priority)
        if refusal is not None:
            return refusal
        work = Work(id=request_id, body=body, params=params, priority=priority, stream=stream)
        try:
            expected_ms = self.backend.estimate_ms(work)
            decision = gov.try_acquire(priority, body=body, params=params, expected_ms=expected_ms)
        except BackendError as exc:
            # Refused before admission: no slot taken, nothing measured.
            return Failure(
                code=ErrorCode.BACKEND_ERROR,
                message=exc.message,
                retryable=exc.retryable,
                invalid=True,
            )
        except Exception as exc:
            log.exception("admitting %r failed", request_id)
            return Failure(
                code=ErrorCode.BACKEND_ERROR,
                message=f"admission failed: {type(exc).__name__}: {exc}"[:_MAX_MESSAGE],
                retryable=False,
            )
        if isinstance(decision, Slot):
            return Admitted(work=work, slot=decision, deadline_ms=deadline_ms)
        return decision

    async def execute(
        self, admitted: Admitted, emit: Emit | None, finish: Finish[R]
    ) -> R | Failure:
        """Run admitted work and release its slot once, however it ends.

        ``executed`` when the backend returned and ``finish`` made a reply of
        the result; ``failed`` when either raised; ``cancelled`` when the
        deadline passed (a ``deadline_exceeded`` failure) or the caller was
        cancelled (the cancellation propagates). A slot still waiting is
        waited for first; one released while waiting only leaves the queue.
        """
        work, slot = admitted.work, admitted.slot
        timeout = math.inf if admitted.deadline_ms is None else admitted.deadline_ms / 1000.0
        try:
            with anyio.move_on_after(timeout):
                if slot.is_waiting:
                    # queued: the Governor hands it a slot as one frees
                    granted = anyio.Event()
                    slot.on_granted(granted.set)
                    await granted.wait()
                try:
                    result = await self.backend.execute(work, emit)
                except BackendError as exc:
                    slot.release("failed")
                    return Failure(
                        code=ErrorCode.BACKEND_ERROR, message=exc.message, retryable=exc.retryable
                    )
                except Exception as exc:
                    slot.release("failed")
                    log.exception("backend %s raised on %r", self.backend.name, work.id)
                    return Failure(
                        code=ErrorCode.BACKEND_ERROR,
                        message=f"backend raised {type(exc).__name__}: {exc}"[:_MAX_MESSAGE],
                        retryable=False,
                    )
                try:
                    reply = await finish(result, slot)
                except BackendError as exc:
                    slot.release("failed")
                    return Failure(
                        code=ErrorCode.BACKEND_ERROR, message=exc.message, retryable=exc.retryable
                    )
                except Exception as exc:  # TypeError, ValueError, RecursionError, ...
                    slot.release("failed")
                    return Failure(
                        code=ErrorCode.BACKEND_ERROR,
                        message=f"backend result is not JSON-serialisable: {exc}"[:_MAX_MESSAGE],
                        retryable=False,
                    )
                slot.release("executed")
                return reply
            # Only the deadline scope ends the block without a return; an outer
            # cancellation (disconnect, shutdown) propagates as an exception.
            where = "waiting in the queue" if slot.is_waiting else "execution"
            slot.release("cancelled")
            return Failure(
                code=ErrorCode.DEADLINE_EXCEEDED,
                message=f"{where} passed the client's deadline_ms={admitted.deadline_ms}",
                retryable=False,
            )
        finally:
            slot.release("cancelled")  # a no-op unless cancelled from outside
