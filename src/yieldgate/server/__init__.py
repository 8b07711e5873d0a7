"""The reference governed server.

A ``Governor`` caps work in execution and yields past the cap; fronts speak
wire protocols over it (the governed TCP front, and HTTP fronts in the OpenAI,
Anthropic, HuggingFace and TGI dialects) through one shared ``Admission``; backends
execute what it admits. The ``server`` extra adds msgspec (a fast path for
decoding submits) and starlette, uvicorn and prometheus_client for the HTTP
fronts, which are imported only when an HTTP front starts serving.

With a ``QuotaConfig``, the HTTP fronts emulate a provider's quota (OpenAI's
requests and tokens per minute, their headers and 429s; on the Messages route
Anthropic's, with input and output tokens apart) before the Governor.

``spawn`` runs ``yieldgate serve`` in a child process instead, and returns a
``ServerProcess`` handle that knows where it listens and stops it.
``write_tokenizer`` writes the served model's byte-level tokenizer (what
``usage`` counts) as HuggingFace's files, for tools that count tokens.
"""

from yieldgate.server._process import ServerProcess, ServerStartError, spawn
from yieldgate.server.admission import Admission
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
from yieldgate.server.http import HttpConfig, HttpFront
from yieldgate.server.quota import ProviderQuota, QuotaConfig
from yieldgate.server.tcp import TcpConfig, TcpFront
from yieldgate.server.tokenizer import write_tokenizer

__all__ = [
    "Admission",
    "AdmissionRequest",
    "Backend",
    "BackendError",
    "Governor",
    "GovernorConfig",
    "GovernorStats",
    "HttpConfig",
    "HttpFront",
    "PriorityPolicy",
    "ProviderQuota",
    "QuotaConfig",
    "Rejection",
    "Server",
    "ServerProcess",
    "ServerStartError",
    "SimulatedBackend",
    "SimulatedConfig",
    "Slot",
    "TcpConfig",
    "TcpFront",
    "Work",
    "Yield",
    "spawn",
    "write_tokenizer",
]
