"""The reference governed server.

A ``Governor`` caps work in execution and yields past the cap; fronts speak
wire protocols over it (the governed TCP front today); backends execute what
it admits. The ``server`` extra adds msgspec, a fast path for decoding submits.
"""

from yieldgate.server.app import Server
from yieldgate.server.backends import (
    Backend,
    BackendError,
    SimulatedBackend,
    SimulatedConfig,
    Work,
)
from yieldgate.server.governor import (
    AdmissionRequest,
    Governor,
    GovernorConfig,
    GovernorStats,
    PriorityPolicy,
    Rejection,
    Slot,
    Yield,
)
from yieldgate.server.tcp import TcpConfig, TcpFront

__all__ = [
    "AdmissionRequest",
    "Backend",
    "BackendError",
    "Governor",
    "GovernorConfig",
    "GovernorStats",
    "PriorityPolicy",
    "Rejection",
    "Server",
    "SimulatedBackend",
    "SimulatedConfig",
    "Slot",
    "TcpConfig",
    "TcpFront",
    "Work",
    "Yield",
]
