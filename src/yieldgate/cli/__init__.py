"""The ``yieldgate`` command: ``serve``, ``burst``, ``demo`` and ``tokenizer``.

Thin on purpose: parse flags into the library's frozen configs, run, report.
Heavy modules are imported inside the subcommand that needs them. Every error
is one line on standard error: status 2 for what was asked wrongly (a flag),
1 for what failed (a missing extra, an unreachable target); ``--log-level
debug`` adds the traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys
import traceback
from collections.abc import Sequence

from yieldgate._extras import MissingExtraError
from yieldgate._version import __version__
from yieldgate.cli._common import CliError, CliFailure, Parser

__all__ = ["main"]

# Flags whose value is a command line of its own: the next word is always their value,
# even when it starts with a dash (``--serve "--max-inflight 2"``).
_WHOLE_VALUES = ("--serve",)


def _parser() -> argparse.ArgumentParser:
    from yieldgate.cli import _burst, _demo, _serve, _tokenizer

    parser = Parser(
        prog="yieldgate",
        description="Client-side backpressure for inference endpoints, and its reference server.",
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {__version__}", help="print the version"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _serve.add_parser(sub)
    _burst.add_parser(sub)
    _demo.add_parser(sub)
    _tokenizer.add_parser(sub)
    return parser


def _join_values(argv: Sequence[str]) -> list[str]:
    """``--serve ARGS`` as ``--serve=ARGS``: argparse would read ARGS starting with a dash
    as an option of its own."""
    out: list[str] = []
    words = iter(argv)
    for word in words:
        if word == "--":
            out.append(word)
            out.extend(words)
            break
        if word in _WHOLE_VALUES:
            value = next(words, None)
            out.append(word if value is None else f"{word}={value}")
        else:
            out.append(word)
    return out


def _leaf(exc: BaseException) -> BaseException:
    """The first error inside (nested) exception groups."""
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc


def _one_line(command: str, exc: BaseException) -> str:
    leaf = _leaf(exc)
    if isinstance(leaf, ModuleNotFoundError) and leaf.name:
        missing = MissingExtraError("this command", leaf.name)
        if missing.extra is not None:
            return str(missing)
    text = " ".join(str(leaf).split()) or "(no message)"
    return f"{type(leaf).__name__}: {text} (--log-level debug shows where)"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the process exit status."""
    parser = _parser()
    args, unknown = parser.parse_known_args(_join_values(sys.argv[1:] if argv is None else argv))
    command = args.command
    if unknown:  # refused by the subcommand, whose name and help the line then gives
        (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        sub.choices[command].error(f"unrecognized arguments: {' '.join(unknown)}")
    level: str = getattr(args, "log_level", "warning")
    debug = level == "debug"
    if command != "serve":  # serve sets up its own log format
        logging.basicConfig(level=level.upper(), format="%(levelname)s %(name)s: %(message)s")
    try:
        status: int = args.run(args)
    except CliError as exc:
        print(f"yieldgate {command}: error: {exc}", file=sys.stderr)
        return 2
    except (CliFailure, MissingExtraError) as exc:
        if debug:
            traceback.print_exc()
        print(f"yieldgate {command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if debug:
            traceback.print_exc()
        print(f"yieldgate {command}: error: {_one_line(command, exc)}", file=sys.stderr)
        return 1
    return status
