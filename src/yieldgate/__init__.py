"""yieldgate: client-side backpressure for inference endpoints.

A backend that buffers a burst hides its overload; clients that retry in
lockstep amplify it. yieldgate's governed server refuses to queue and answers
``yield`` with an honest retry hint; the SDK's ``Gate`` treats a yield as a
congestion signal, not a failure: it narrows its window and comes back around
the hint, with jitter, within a retry budget.

The public surface is what ``__all__`` lists; modules whose names start with
an underscore are private. The wire protocol lives in ``yieldgate.protocol``,
the reference server in ``yieldgate.server``, telemetry types in
``yieldgate.gate``. Importing ``yieldgate`` never imports the extras (torch,
starlette, uvicorn, rich).
"""

from importlib import metadata as _metadata

from yieldgate._exceptions import (
    AttemptTimeoutError,
    CallFailedError,
    CircuitOpenError,
    DeadlineExceededError,
    FrameError,
    GateClosedError,
    IntegrityError,
    ProtocolError,
    RemoteError,
    ResponseFormatError,
    RetriesExhaustedError,
    RetryBudgetExhaustedError,
    StreamInterruptedError,
    TransportError,
    YieldExhaustedError,
    YieldgateError,
)
from yieldgate.gate import (
    BreakerPolicy,
    Gate,
    GatePolicy,
    HedgePolicy,
    Outcome,
    RatePolicy,
    RetryBudgetPolicy,
    RetryPolicy,
    TimeoutPolicy,
    WindowPolicy,
    current_attempt,
)
from yieldgate.protocol import Priority
from yieldgate.transports import GovernedClient, gate_transport, http_client

try:
    __version__ = _metadata.version("yieldgate")
except _metadata.PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0"

__all__ = [
    "AttemptTimeoutError",
    "BreakerPolicy",
    "CallFailedError",
    "CircuitOpenError",
    "DeadlineExceededError",
    "FrameError",
    "Gate",
    "GateClosedError",
    "GatePolicy",
    "GovernedClient",
    "HedgePolicy",
    "IntegrityError",
    "Outcome",
    "Priority",
    "ProtocolError",
    "RatePolicy",
    "RemoteError",
    "ResponseFormatError",
    "RetriesExhaustedError",
    "RetryBudgetExhaustedError",
    "RetryBudgetPolicy",
    "RetryPolicy",
    "StreamInterruptedError",
    "TimeoutPolicy",
    "TransportError",
    "WindowPolicy",
    "YieldExhaustedError",
    "YieldgateError",
    "__version__",
    "current_attempt",
    "gate_transport",
    "http_client",
]
