"""``yieldgate burst``: fire an arrival profile at a target, per strategy, and report.

Thin on purpose: flags become a ``yieldgate.burst.BurstConfig``; the package
does the work. A preset fills in what the flags leave out.
"""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path
from typing import Any

from yieldgate.cli._common import CliError

STRATEGIES = ("yieldgate", "naive", "tenacity", "openai-default")


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "burst",
        help="fire a burst at a target through several client strategies and compare",
        description=(
            "Send N requests on an arrival profile to a target, through one or more client "
            "strategies, and report success, attempts, yields, errors, makespan, latency, "
            "streaming metrics and goodput. Needs the 'burst' extra. docs/burst.md is the guide."
        ),
    )
    p.add_argument(
        "--target",
        help=(
            "tcp://HOST:PORT, openai+http://HOST:PORT, hf+http://HOST:PORT[/models/NAME] or "
            "tgi+http://HOST:PORT; with --serve a bare scheme (tcp://) will do (default tcp://)"
        ),
    )
    p.add_argument(
        "--serve",
        metavar='"ARGS"',
        help=(
            "start 'yieldgate serve ARGS' for each strategy, so each meets a fresh server "
            "(without it, every strategy shares the target's state)"
        ),
    )
    p.add_argument(
        "--preset",
        choices=["cold-start", "saturated", "quota"],
        help="a named scenario; other flags override its settings (docs/burst.md)",
    )
    p.add_argument("--requests", "-n", type=int, help="requests per strategy (default 100)")
    p.add_argument(
        "--profile",
        help=(
            "arrivals: all-at-once (default), poisson:RATE, gamma:RATE:BURSTINESS, "
            "ramp:START_RATE:END_RATE:SECONDS"
        ),
    )
    p.add_argument(
        "--strategy",
        help=f"comma-separated, from {', '.join(STRATEGIES)} (default yieldgate)",
    )
    p.add_argument(
        "--compare",
        action="store_true",
        help="run every strategy (or those --strategy names), each against a fresh server",
    )
    p.add_argument(
        "--policy",
        help="the yieldgate strategy's Gate policy: default, cold_start, interactive, batch, "
        "or a JSON file",
    )
    p.add_argument("--stream", action="store_true", default=None, help="stream the replies")
    p.add_argument(
        "--prompt-tokens",
        metavar="TOKENS[:WEIGHT],...",
        help="prompt lengths as a weighted mix, e.g. 32:0.75,320:0.25 (one byte is one token)",
    )
    p.add_argument("--max-tokens", type=int, help="tokens to generate per request")
    p.add_argument("--model", help="model name for openai / hf targets (default yieldgate-sim)")
    p.add_argument("--dialect", help="dialect under the HTTP clients (default: the target's)")
    p.add_argument("--slo-ttft-ms", type=float, help="TTFT objective for goodput (streaming)")
    p.add_argument("--slo-tpot-ms", type=float, help="TPOT objective for goodput (streaming)")
    p.add_argument("--slo-e2e-ms", type=float, help="end-to-end latency objective for goodput")
    p.add_argument(
        "--wait-ready",
        action="store_true",
        default=None,
        help="before firing, wait until the server's stats say it is no longer cold",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of arrivals, prompts and jitter")
    p.add_argument(
        "--sample-ms", type=float, default=100.0, help="timeline sampling period (default 100)"
    )
    p.add_argument("--json", type=Path, metavar="PATH", help="write the results as JSON")
    p.add_argument("--plot", type=Path, metavar="PATH", help="write a PNG plot of the timelines")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--print-schema", action="store_true", help="print the JSON schema of --json and exit"
    )
    p.set_defaults(run=run)


def _mix(text: str) -> tuple[tuple[int, float], ...]:
    out = []
    for part in text.split(","):
        tokens, _, weight = part.strip().partition(":")
        try:
            out.append((int(tokens), float(weight) if weight else 1.0))
        except ValueError:
            raise ValueError(f"--prompt-tokens: bad entry {part!r}") from None
    return tuple(out)


def build_config(args: argparse.Namespace) -> Any:
    """Flags (over a preset) into a ``BurstConfig``; bad values raise ``CliError``."""
    from yieldgate.burst import (
        PRESETS,
        ArrivalProfile,
        BurstConfig,
        Slo,
        Strategy,
        Workload,
    )

    settings: dict[str, Any] = dict(PRESETS[args.preset]) if args.preset else {}
    try:
        if args.serve is not None:
            settings["serve_args"] = tuple(shlex.split(args.serve))
        if args.target is not None:
            settings["target"] = args.target
        settings.setdefault("target", "tcp://")
        if args.requests is not None:
            settings["requests"] = args.requests
        if args.profile is not None:
            settings["profile"] = ArrivalProfile.parse(args.profile)
        if args.strategy is not None:
            names = [n.strip() for n in args.strategy.split(",") if n.strip()]
        elif args.compare:
            names = list(STRATEGIES)
        elif "strategies" in settings:
            names = [s.name for s in settings["strategies"]]
        else:
            names = ["yieldgate"]
        unknown = [n for n in names if n not in STRATEGIES]
        if unknown:
            raise CliError(f"unknown strategy {unknown[0]!r}: use {', '.join(STRATEGIES)}")
        if len(names) > 1 and not args.compare and args.strategy is not None:
            raise CliError("several strategies need --compare")
        settings["strategies"] = tuple(Strategy.parse(n, policy=args.policy) for n in names)
        old: Any = settings.get("workload", Workload())
        settings["workload"] = Workload(
            stream=old.stream if args.stream is None else True,
            prompt_tokens=old.prompt_tokens
            if args.prompt_tokens is None
            else _mix(args.prompt_tokens),
            max_tokens=old.max_tokens if args.max_tokens is None else args.max_tokens,
            model=old.model if args.model is None else args.model,
        )
        slo: Any = settings.get("slo", Slo())
        settings["slo"] = Slo(
            ttft_ms=slo.ttft_ms if args.slo_ttft_ms is None else args.slo_ttft_ms,
            tpot_ms=slo.tpot_ms if args.slo_tpot_ms is None else args.slo_tpot_ms,
            e2e_ms=slo.e2e_ms if args.slo_e2e_ms is None else args.slo_e2e_ms,
        )
        if args.dialect is not None:
            settings["dialect"] = args.dialect
        if args.wait_ready:
            settings["wait_ready"] = True
        settings["seed"] = args.seed
        settings["sample_interval_s"] = args.sample_ms / 1000
        return BurstConfig(**settings)
    except ValueError as exc:
        raise CliError(str(exc)) from None


class _RichProgress:
    """A rich progress bar on stderr: one line per strategy."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.bar = Progress(
            TextColumn("{task.description:<16}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=Console(stderr=True),
        )
        self.task: Any = None

    def __enter__(self) -> _RichProgress:
        self.bar.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.bar.stop()

    def start(self, label: str, total: int) -> None:
        self.task = self.bar.add_task(label, total=total)

    def advance(self) -> None:
        self.bar.advance(self.task)

    def finish(self, result: Any) -> None:
        self.bar.update(self.task, completed=result.requests)


def execute(config: Any, *, progress: bool, json_path: Path | None, plot_path: Path | None) -> Any:
    """Run ``config``, print the table, write the files; shared with ``yieldgate demo``."""

    from yieldgate.burst import render_table, run_burst, write_plot
    from yieldgate.server import ServerStartError

    try:
        if progress:
            with _RichProgress() as bar:
                report = run_burst(config, progress=bar)
        else:
            report = run_burst(config)
    except (RuntimeError, ImportError, TimeoutError, ServerStartError) as exc:
        raise CliError(str(exc)) from None
    render_table(report)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report.as_dict(), indent=1) + "\n", encoding="utf-8")
        print(f"results written to {json_path}")
    if plot_path is not None:
        print(f"plot written to {write_plot(report, plot_path)}")
    return report


def _check_extra() -> None:
    try:
        import matplotlib  # noqa: F401
        import rich  # noqa: F401
    except ImportError as exc:
        raise CliError(
            f"yieldgate burst needs the 'burst' extra ({exc}): pip install 'yieldgate[burst]'"
        ) from None


def run(args: argparse.Namespace) -> int:
    if args.print_schema:
        from yieldgate.burst import SCHEMA

        print(json.dumps(SCHEMA, indent=1))
        return 0
    _check_extra()
    config = build_config(args)
    execute(
        config,
        progress=not args.no_progress,
        json_path=args.json,
        plot_path=args.plot,
    )
    return 0
