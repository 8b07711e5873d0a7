"""The public surface: curated, sorted, and free of the heavy extras."""

from __future__ import annotations

import subprocess
import sys

import yieldgate


def test_all_is_sorted_and_complete() -> None:
    public = sorted(name for name in dir(yieldgate) if not name.startswith("_"))
    exported = [name for name in yieldgate.__all__ if name != "__version__"]
    assert exported == sorted(exported)
    # Every public attribute is exported (submodules aside).
    modules = {"protocol", "server", "cli", "gate", "transports", "dialects", "harness", "burst"}
    assert [n for n in public if n not in modules] == exported


def test_errors_share_one_root() -> None:
    assert issubclass(yieldgate.FrameError, yieldgate.ProtocolError)
    assert issubclass(yieldgate.ProtocolError, yieldgate.YieldgateError)


def test_importing_yieldgate_pulls_in_no_extra() -> None:
    code = (
        "import sys, yieldgate, yieldgate.protocol, yieldgate.server; "
        "heavy = {'torch', 'starlette', 'uvicorn', 'rich', 'matplotlib', 'prometheus_client', "
        "'httpx2', 'openai', 'huggingface_hub', 'yieldgate.burst'}; "
        "print(sorted(heavy & set(sys.modules)))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"
