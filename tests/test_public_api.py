"""The public surface: curated, sorted, and free of the heavy extras."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import yieldgate
import yieldgate.dialects
import yieldgate.gate
import yieldgate.protocol

# What a user needs: a Gate and its policies, what a classifier works with, the
# transports and the official clients' helpers, and the errors a caller catches.
SURFACE = {
    "gate": [
        "Gate",
        "GatePolicy",
        "WindowPolicy",
        "RetryPolicy",
        "RetryBudgetPolicy",
        "BreakerPolicy",
        "TimeoutPolicy",
        "RatePolicy",
        "HedgePolicy",
        "QuotaPolicy",
        "Cost",
        "FleetPolicy",
        "Priority",
        "current_attempt",
    ],
    "classifying": ["Outcome", "OutcomeKind", "default_classify"],
    "transports": [
        "GovernedClient",
        "http_client",
        "gate_transport",
        "openai_client",
        "anthropic_client",
        "huggingface_clients",
    ],
    "errors": [
        "YieldgateError",
        "GateClosedError",
        "BlockingCallError",
        "CallFailedError",
        "GaveUpError",
        "RetriesExhaustedError",
        "YieldExhaustedError",
        "RetryBudgetExhaustedError",
        "CircuitOpenError",
        "DeadlineExceededError",
        "FleetConfigError",
        "AttemptTimeoutError",
        "TransportError",
        "StreamInterruptedError",
        "RemoteError",
        "QuotaExhaustedError",
        "RequestTooLargeError",
        "MissingExtraError",
    ],
}


def test_all_is_sorted_and_complete() -> None:
    public = sorted(name for name in dir(yieldgate) if not name.startswith("_"))
    exported = [name for name in yieldgate.__all__ if name != "__version__"]
    assert exported == sorted(exported)
    # Every public attribute is exported (submodules aside).
    modules = {
        "protocol",
        "server",
        "cli",
        "gate",
        "transports",
        "dialects",
        "harness",
        "burst",
        "fleet",
    }
    assert [n for n in public if n not in modules] == exported


def test_all_is_the_curated_surface() -> None:
    curated = sorted(name for names in SURFACE.values() for name in names)
    assert sorted(n for n in yieldgate.__all__ if n != "__version__") == curated


def test_protocol_details_live_in_their_modules() -> None:
    for name in ("ProtocolError", "FrameError", "IntegrityError"):
        assert name in yieldgate.protocol.__all__
        assert not hasattr(yieldgate, name)
    assert "ResponseFormatError" in yieldgate.dialects.__all__
    assert not hasattr(yieldgate, "ResponseFormatError")
    # The records a Gate hands back, for annotations and extensions.
    for name in ("GateStatistics", "AttemptInfo", "Lease", "Signal", "USE_POLICY"):
        assert name in yieldgate.gate.__all__


def test_the_top_level_names_are_the_modules_own() -> None:
    assert yieldgate.OutcomeKind is yieldgate.gate.OutcomeKind
    assert yieldgate.default_classify is yieldgate.gate.default_classify
    assert yieldgate.Priority is yieldgate.protocol.Priority


def test_importing_yieldgate_pulls_in_no_extra() -> None:
    # Every one of them is installed here (the dev environment has every extra), so
    # each could be imported: redis and opentelemetry-sdk by pybreaker, as it once was.
    heavy = [
        "torch", "starlette", "uvicorn", "rich", "matplotlib", "prometheus_client", "httpx",
        "httpx2", "openai", "anthropic", "google.genai", "huggingface_hub", "redis",
        "opentelemetry.sdk", "yieldgate.burst",
    ]  # fmt: skip
    assert all(importlib.util.find_spec(name) is not None for name in heavy)
    code = (
        "import sys, yieldgate, yieldgate.protocol, yieldgate.server; "
        "yieldgate.Gate(name='built').call_sync(lambda: 1); "
        f"print(sorted(set({heavy!r}) & set(sys.modules)))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


def test_a_callers_own_pybreaker_keeps_its_redis_support() -> None:
    # The Gate's breaker imports pybreaker with redis refused; a caller importing
    # pybreaker afterwards for its CircuitRedisStorage must still get the whole module.
    code = (
        "import yieldgate, yieldgate.gate, sys; yieldgate.Gate(); "
        "import pybreaker; print(pybreaker.HAS_REDIS_SUPPORT, 'redis' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.split() == ["True", "True"]


def test_the_protocol_module_needs_nothing_but_the_standard_library_and_its_errors() -> None:
    # Shared by the server, which never imports the gate: its errors come from
    # the exception module, not from the package that re-exports them. The
    # module re-exports its pieces from yieldgate._protocol, held to the same rule.
    public = Path(yieldgate.protocol.__file__)
    files = [public, *sorted((public.parent / "_protocol").glob("*.py"))]
    imported = {
        (node.module or "") if isinstance(node, ast.ImportFrom) else alias.name
        for file in files
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8")))
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    own = {name for name in imported if name.split(".")[0] == "yieldgate"}
    pieces = {name for name in own if name.startswith("yieldgate._protocol.")}
    # Its errors, and the header names it shares with the HTTP fronts (plain constants).
    assert own - pieces <= {"yieldgate._exceptions", "yieldgate._headers"}
    assert all(name.split(".")[0] in sys.stdlib_module_names for name in imported - own)
