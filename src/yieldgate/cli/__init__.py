"""The ``yieldgate`` command: ``serve``, ``burst``, ``demo`` and ``tokenizer``.

Thin on purpose: parse flags into the library's frozen configs, run, report.
Heavy modules are imported inside the subcommand that needs them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from yieldgate._version import __version__
from yieldgate.cli._common import CliError

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    from yieldgate.cli import _burst, _demo, _serve, _tokenizer

    parser = argparse.ArgumentParser(
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


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the process exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        status: int = args.run(args)
    except CliError as exc:
        print(f"yieldgate {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return status
