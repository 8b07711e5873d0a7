"""yieldgate: client-side backpressure for inference endpoints.

A backend that buffers a burst hides its overload; clients that retry in
lockstep amplify it. yieldgate's governed server refuses to queue and answers
``yield`` with an honest retry hint; the SDK's ``Gate`` treats a yield as a
congestion signal, not a failure: it narrows its window and comes back around
the hint, with jitter, within a retry budget.

The public surface is what ``__all__`` lists: a Gate and its policies, what a
classifier works with, the transports (the official clients' among them) and
the errors a caller catches. Modules whose names start with an underscore are
private. The wire protocol and its errors live in ``yieldgate.protocol``, the
reference server in ``yieldgate.server``, the dialects in
``yieldgate.dialects``, and the Gate's records, leases and telemetry types in
``yieldgate.gate``. Importing ``yieldgate`` imports neither the extras (torch,
starlette, uvicorn, rich) nor an HTTP library (httpx, httpx2) nor an official
client: each is imported when first used.
"""

from yieldgate._exceptions import (
    AttemptTimeoutError,
    BlockingCallError,
    CallFailedError,
    CircuitOpenError,
    DeadlineExceededError,
    FleetConfigError,
    GateClosedError,
    GaveUpError,
    QuotaExhaustedError,
    RemoteError,
    RequestTooLargeError,
    RetriesExhaustedError,
    RetryBudgetExhaustedError,
    StreamInterruptedError,
    TransportError,
    YieldExhaustedError,
    YieldgateError,
)
from yieldgate._extras import MissingExtraError
from yieldgate._version import __version__
from yieldgate.gate import (
    BreakerPolicy,
    Cost,
    FleetPolicy,
    Gate,
    GatePolicy,
    HedgePolicy,
    Outcome,
    OutcomeKind,
    QuotaPolicy,
    RatePolicy,
    RetryBudgetPolicy,
    RetryPolicy,
    TimeoutPolicy,
    WindowPolicy,
    current_attempt,
    default_classify,
)
from yieldgate.protocol import Priority
from yieldgate.transports import (
    GovernedClient,
    anthropic_client,
    gate_transport,
    http_client,
    huggingface_clients,
    openai_client,
)

__all__ = [
    "AttemptTimeoutError",
    "BlockingCallError",
    "BreakerPolicy",
    "CallFailedError",
    "CircuitOpenError",
    "Cost",
    "DeadlineExceededError",
    "FleetConfigError",
    "FleetPolicy",
    "Gate",
    "GateClosedError",
    "GatePolicy",
    "GaveUpError",
    "GovernedClient",
    "HedgePolicy",
    "MissingExtraError",
    "Outcome",
    "OutcomeKind",
    "Priority",
    "QuotaExhaustedError",
    "QuotaPolicy",
    "RatePolicy",
    "RemoteError",
    "RequestTooLargeError",
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
    "anthropic_client",
    "current_attempt",
    "default_classify",
    "gate_transport",
    "http_client",
    "huggingface_clients",
    "openai_client",
]
