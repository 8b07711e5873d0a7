"""What ``yieldgate burst`` checks before it starts and says after it ends.

Before: every package the run will import, from the extras and beyond them (the
official clients of a target), so that a missing one is one line with its pip
line before any server starts, not a failure halfway through. After: whether
any request reached the target, and the line of a run cut short.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from yieldgate._extras import EXTRAS, MissingExtraError, require
from yieldgate.cli._common import CliFailure

__all__ = ["check_extra", "check_packages", "check_reached", "stopped_line"]

# What each target's client imports, by import name, and the pip line that brings it.
_CLIENTS = {
    "openai": ("openai", "pip install openai"),
    "anthropic": ("anthropic", "pip install anthropic"),
    "hf": ("huggingface_hub", "pip install huggingface-hub"),
}
_SCHEMES = {"openai": "openai+http://", "anthropic": "anthropic+http://", "hf": "hf+http://"}
# What a server with an HTTP front imports (``yieldgate.server.http``'s own list).
_HTTP_FRONT = ("starlette", "uvicorn", "prometheus_client")


def check_extra(command: str) -> None:
    """The ``burst`` extra, or ``MissingExtraError`` naming it, before anything runs."""
    for module in EXTRAS["burst"]:
        require(module, command)


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a blocked or broken parent package
        return False


def check_packages(configs: Iterable[Any]) -> None:
    """Every package the runs of ``configs`` (``BurstConfig``) will import, or
    ``MissingExtraError`` naming the first missing one and its pip line."""
    from yieldgate.burst._targets import Target

    for config in configs:
        kind = Target.parse(config.target).kind
        if kind in _CLIENTS:
            module, line = _CLIENTS[kind]
            if not _installed(module):
                raise _Missing(f"an {_SCHEMES[kind]} target", module, line)
        if config.serve_args is not None and kind != "tcp":
            for module in _HTTP_FRONT:
                require(module, "--serve with an HTTP target (the server's HTTP front)")


class _Missing(MissingExtraError):
    """A package no extra brings: its own pip line."""

    def __init__(self, what: str, module: str, line: str) -> None:
        super().__init__(what, module)
        text = f"{what} needs the {module} package (no module named {module!r}): {line}"
        self.msg, self.args = text, (text,)


def check_reached(report: Any) -> None:
    """``CliFailure`` when not one request of the whole run reached its target."""
    from yieldgate.burst._unreachable import unreached

    reason = unreached(report)
    if reason is not None:
        raise CliFailure(f"{reason}: no request reached the target")


def stopped_line(command: str, report: Any, died: bool, written: Iterable[Path]) -> str:
    """The one line of a run cut short: why, and where its partial report is."""
    files = ", ".join(str(p) for p in written)
    where = f"partial report in {files}" if files else "partial results above"
    if died:
        return f"yieldgate {command}: error: {report.stopped_by}; {where}"
    return f"yieldgate {command}: {report.stopped_by}; {where}"
