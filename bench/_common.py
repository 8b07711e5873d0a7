"""What the benchmarks share: the smoke switch, and tenacity's jittered backoff.

Smoke mode (``--smoke`` on any ``bench/*.py``, or ``YIELDGATE_BENCH_SMOKE=1`` in
the environment) runs a benchmark in a tiny configuration, one round, in seconds,
and writes nothing into docs/: it checks that the script still works, not what it
measures. ``make bench-smoke`` (part of ``make test``) runs every benchmark so.

A benchmark that needs what this machine lacks (another virtualenv, a program
not installed) prints one line, ``skipped: <why>``, and exits 0; that is the only
case in which a benchmark that did not run exits 0.
"""

from __future__ import annotations

import argparse
import inspect
import os
from typing import Any

SMOKE_ENV = "YIELDGATE_BENCH_SMOKE"


def add_smoke_flag(parser: argparse.ArgumentParser) -> None:
    """Give ``parser`` the ``--smoke`` flag every benchmark takes."""
    parser.add_argument(
        "--smoke",
        action="store_true",
        help=f"a tiny run, seconds, writing nothing (also {SMOKE_ENV}=1)",
    )


def smoke(args: argparse.Namespace | None = None) -> bool:
    """Whether this run is a smoke run: ``--smoke`` given, or the variable set."""
    if args is not None and getattr(args, "smoke", False):
        return True
    return os.environ.get(SMOKE_ENV, "").strip() not in ("", "0")


def skip(reason: str) -> int:
    """Say in one line why this benchmark does not run here; the exit status (0)."""
    print(f"skipped: {reason}", flush=True)
    return 0


def exponential_jitter(multiplier: float, max_s: float) -> Any:
    """tenacity's ``wait_exponential_jitter`` with its first wait ``multiplier`` seconds.

    tenacity up to 9.1 calls that argument ``initial``; 9.2 calls it
    ``multiplier``. google-genai pins tenacity below 9.2, so both are met: the name
    is read from the installed signature rather than guessed from a version.
    """
    from tenacity import wait_exponential_jitter

    params = inspect.signature(wait_exponential_jitter.__init__).parameters
    name = "multiplier" if "multiplier" in params else "initial"
    return wait_exponential_jitter(**{name: multiplier, "max": max_s})
