"""The Gate and its parts: window, retry loop, budget, breaker, rate cap, telemetry.

Users import the public names from ``yieldgate``; this package holds the
implementation, one concept per private module: the sans-IO core (``_core``,
``_call`` and the parts they compose), the two drivers (``_async``, ``_sync``),
the retry loop on tenacity (``_retrying``), hedging, the upstream set, the
policies, and the ``Gate`` façade. docs/design.md draws the picture.
"""

from yieldgate.gate._attempt import AttemptInfo, current_attempt
from yieldgate.gate._breaker import BreakerPolicy, BreakerState
from yieldgate.gate._budget import RetryBudgetPolicy
from yieldgate.gate._gate import Gate, Lease
from yieldgate.gate._hedge import HedgePolicy
from yieldgate.gate._outcome import (
    Classifier,
    Outcome,
    OutcomeKind,
    OutcomeSignal,
    default_classify,
)
from yieldgate.gate._policy import (
    USE_POLICY,
    FleetPolicy,
    GatePolicy,
    QuotaPolicy,
    UsePolicy,
)
from yieldgate.gate._quota import Cost, QuotaReading
from yieldgate.gate._ratecap import RatePolicy
from yieldgate.gate._retry import RetryPolicy, TimeoutPolicy
from yieldgate.gate._statistics import GateStatistics
from yieldgate.gate._telemetry import (
    AttemptDetails,
    BreakerChange,
    CallDetails,
    CallObserver,
    Instrumentation,
    NullInstrumentation,
    OtelInstrumentation,
    WaitDetails,
    WindowChange,
)
from yieldgate.gate._upstream import UpstreamStatistics
from yieldgate.gate._window import Signal, WindowPolicy, WindowStatistics

__all__ = [
    "USE_POLICY",
    "AttemptDetails",
    "AttemptInfo",
    "BreakerChange",
    "BreakerPolicy",
    "BreakerState",
    "CallDetails",
    "CallObserver",
    "Classifier",
    "Cost",
    "FleetPolicy",
    "Gate",
    "GatePolicy",
    "GateStatistics",
    "HedgePolicy",
    "Instrumentation",
    "Lease",
    "NullInstrumentation",
    "OtelInstrumentation",
    "Outcome",
    "OutcomeKind",
    "OutcomeSignal",
    "QuotaPolicy",
    "QuotaReading",
    "RatePolicy",
    "RetryBudgetPolicy",
    "RetryPolicy",
    "Signal",
    "TimeoutPolicy",
    "UpstreamStatistics",
    "UsePolicy",
    "WaitDetails",
    "WindowChange",
    "WindowPolicy",
    "WindowStatistics",
    "current_attempt",
    "default_classify",
]
