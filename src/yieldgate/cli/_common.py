"""Helpers shared by the subcommands: their errors, parser, help and checks.

Errors, one line each on standard error: ``CliError`` (what was asked cannot be
done as asked: exit status 2, as argparse's own usage errors) and
``CliFailure`` (it was tried and failed: the target, the environment; exit
status 1). A missing extra is a ``yieldgate._extras.MissingExtraError``, status
1 too. Anything else is one line and status 1, with its traceback only under
``--log-level debug``.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import anyio

T = TypeVar("T")

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


class CliError(Exception):
    """A problem with what the user asked for, reported as one line, exit status 2."""


class CliFailure(Exception):
    """What the user asked for was tried and failed (an unreachable target): one line,
    exit status 1."""


class HelpFormatter(argparse.HelpFormatter):
    """``--help`` shows each option's default, unless its help already says it or it has
    none to show (``None``, an off switch, an empty list)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            not action.option_strings
            or "default" in text
            or default is None
            or default is False
            or default == []
            or default is argparse.SUPPRESS
        ):
            return text
        return f"{text} (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line (and whose subcommands' are too:
    ``add_subparsers`` makes them of the parent's class)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def add_log_level(p: argparse.ArgumentParser) -> None:
    """``--log-level``: the logging level, and ``debug`` shows an error's traceback."""
    p.add_argument(
        "--log-level",
        default="warning",
        type=str.lower,
        choices=LOG_LEVELS,
        help="logging level; debug also prints the traceback of an error (default: warning)",
    )


def check_outputs(outputs: Iterable[tuple[str, Path | None]]) -> None:
    """Each ``(flag, path)`` given must name a file in a directory that exists: a typo in
    a directory is an error now, not a directory made somewhere unexpected."""
    for flag, path in outputs:
        if path is None:
            continue
        parent = path.parent
        if not parent.is_dir():
            state = "is not a directory" if parent.exists() else "does not exist"
            raise CliError(f"{flag}: directory {parent} {state}")
        if path.is_dir():
            raise CliError(f"{flag}: {path} is a directory; give a file name")


def check_input(flag: str, path: Path | None) -> None:
    """``path`` (from ``flag``), when given, must be a readable file."""
    if path is None:
        return
    if not path.exists():
        raise CliError(f"{flag}: {path} does not exist")
    if not path.is_file():
        raise CliError(f"{flag}: {path} is not a file")


def flag_error(exc: Exception, flags: Mapping[str, str]) -> CliError:
    """A config's ``ValueError`` as a ``CliError`` naming the flag, not the attribute:
    each whole-word ``attribute`` of ``flags`` in its message becomes its ``--flag``."""
    message = str(exc)
    for name in sorted(flags, key=len, reverse=True):
        before = r"(?<![\w-])" if re.match(r"\w", name) else ""
        after = r"(?![\w-])" if re.search(r"\w$", name) else ""
        message = re.sub(before + re.escape(name) + after, flags[name], message)
    return CliError(message)


def run_async(fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """Run ``fn`` on asyncio, with uvloop when it is installed."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        options: dict[str, Any] = {}
    else:
        options = {"use_uvloop": True}
    return anyio.run(fn, *args, backend="asyncio", backend_options=options)
