"""``yieldgate tokenizer``: write the served model's tokenizer for tools that count tokens."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from yieldgate.cli._common import CliError, add_log_level


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "tokenizer",
        help="write the served model's tokenizer (HuggingFace files) into a directory",
        description=(
            "Write the served model's tokenizer, byte-level for both backends (a token is one "
            "byte of the text's UTF-8, its id the byte's value), as tokenizer.json and "
            "tokenizer_config.json: HuggingFace's tokenizers and transformers load it from the "
            "directory offline, so benchmark tools (vLLM's 'bench serve --tokenizer DIR', "
            "inference-perf) count what the server's usage counts. Prints each file written."
        ),
    )
    p.add_argument(
        "directory",
        nargs="?",
        type=Path,
        help=(
            "where to write (made if missing; default: the --model name, where a tool given "
            "that name as its tokenizer finds it from the current directory)"
        ),
    )
    p.add_argument(
        "--model",
        default="yieldgate-sim",
        help="the served model's name, as 'yieldgate serve --model-name' (default: yieldgate-sim)",
    )
    p.add_argument(
        "--max-length",
        type=int,
        help=(
            "model_max_length, the longest sequence tools should send (the harness's model: "
            "2048); default: no limit"
        ),
    )
    add_log_level(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from yieldgate.server.tokenizer import write_tokenizer

    directory = args.directory if args.directory is not None else Path(args.model)
    try:
        written = write_tokenizer(
            directory, model_name=args.model, model_max_length=args.max_length
        )
    except ValueError as exc:
        raise CliError(str(exc)) from None
    except OSError as exc:
        raise CliError(f"cannot write {directory}: {exc.strerror or exc}") from None
    for path in written:
        print(path)
    return 0
