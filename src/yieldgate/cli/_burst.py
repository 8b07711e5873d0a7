"""``yieldgate burst``: fire an arrival profile at a target, per strategy, and report.

Thin on purpose: flags become a ``yieldgate.burst.BurstConfig``; the package
does the work. A preset fills in what the flags leave out.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from yieldgate._extras import MissingExtraError
from yieldgate.cli import _burst_checks as checks
from yieldgate.cli._burst_checks import check_extra
from yieldgate.cli._common import (
    CliError,
    CliFailure,
    add_log_level,
    check_outputs,
    flag_error,
)
from yieldgate.cli._progress import RichProgress

__all__ = ["add_parser", "build_config", "build_sweep", "check_extra", "execute", "run"]

STRATEGIES = ("yieldgate", "naive", "tenacity", "openai-default", "anthropic-default")

# The names BurstConfig's errors use, as the flags that set them (phrases where the
# bare word also appears in other messages).
FLAGS = {
    "target '": "--target '",
    "trace '": "--profile trace '",
    "requests must": "--requests must",
    "concurrency must": "--concurrency must",
    "workers must": "--workers must",
    "workers > 1": "--workers > 1",
    "sample_interval_s": "--sample-ms",
    "timeout_s": "--timeout-s",
    "recovery_probe_s": "--recovery-probe-ms",
    "priority_mix": "--priority-mix",
    "priority mix": "--priority-mix",
    "scrape": "--scrape",
    "prompt_tokens": "--prompt-tokens",
    "max_tokens": "--max-tokens",
    "policy": "--policy",
    "policy file": "--policy file",
    "slo": "--slo",
    "profile": "--profile",
}


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
            "tcp://HOST:PORT, openai+http://HOST:PORT, anthropic+http://HOST:PORT, "
            "hf+http://HOST:PORT[/models/NAME], tgi+http://HOST:PORT or raw+http://HOST:PORT "
            "(a lean client, for load); with "
            "--serve a bare scheme (tcp://) will do (default tcp://)"
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
        # Spelled here so that `--help` imports no burst code; a test keeps it PRESETS'.
        choices=[
            "buffering",
            "buffering-governed",
            "buffering-vs-governed",
            "cold-start",
            "quota",
            "saturated",
        ],
        help="a named scenario; other flags override its settings (docs/burst.md); "
        "buffering-vs-governed runs buffering and buffering-governed into one report",
    )
    p.add_argument("--requests", "-n", type=int, help="requests per strategy (default 100)")
    p.add_argument(
        "--profile",
        help=(
            "arrivals: all-at-once (default), poisson:RATE, gamma:RATE:BURSTINESS, "
            "ramp:START_RATE:END_RATE:SECONDS (linear), exp-ramp:START_RATE:END_RATE:SECONDS, "
            "trace:PATH (JSONL of offset_s, prompt or prompt_chars, max_tokens)"
        ),
    )
    p.add_argument(
        "--burstiness",
        type=float,
        help="gamma shape of the inter-arrival times (1 is Poisson, below 1 burstier), "
        "for poisson:RATE or a rate sweep",
    )
    p.add_argument(
        "--concurrency",
        type=int,
        help="most requests outstanding at once; an arrival waits for one to end (no cap)",
    )
    p.add_argument(
        "--workers",
        type=int,
        help="send from N processes, each its share of every strategy's requests, "
        "into one merged report (default 1)",
    )
    p.add_argument(
        "--sweep",
        metavar="AXIS=VALUES",
        help="run one point per value: rate=1,2,4,8, rate=1:16:x2 (multiply), "
        "concurrency=4:16:+4 (add)",
    )
    p.add_argument(
        "--strategy",
        help=f"comma-separated, from {', '.join(STRATEGIES)} (default yieldgate)",
    )
    p.add_argument(
        "--compare",
        action="store_true",
        help="run every strategy (or those --strategy names), each against a fresh server; "
        "anthropic-default only on an anthropic+http:// target",
    )
    p.add_argument(
        "--policy",
        help="the yieldgate strategy's Gate policy: default, cold_start, interactive, batch, "
        "or a JSON file (default: default)",
    )
    p.add_argument("--stream", action="store_true", default=None, help="stream the replies")
    p.add_argument(
        "--prompt-tokens",
        metavar="TOKENS[:WEIGHT],...",
        help="prompt lengths as a weighted mix, e.g. 32:0.75,320:0.25 (one byte is one token)",
    )
    p.add_argument("--max-tokens", type=int, help="tokens to generate per request")
    p.add_argument(
        "--model", help="model name for openai / anthropic / hf targets (default yieldgate-sim)"
    )
    p.add_argument("--dialect", help="dialect under the HTTP clients (default: the target's)")
    p.add_argument(
        "--slo",
        metavar="NAME=MS,...",
        help="objectives for goodput: ttft_ms=..., tpot_ms=..., e2e_ms=... (any of them)",
    )
    p.add_argument("--slo-ttft-ms", type=float, help="TTFT objective for goodput (streaming)")
    p.add_argument("--slo-tpot-ms", type=float, help="TPOT objective for goodput (streaming)")
    p.add_argument("--slo-e2e-ms", type=float, help="end-to-end latency objective for goodput")
    p.add_argument(
        "--wait-ready",
        action="store_true",
        default=None,
        help="before firing, wait until the server's stats say it is no longer cold",
    )
    p.add_argument(
        "--timeout-s",
        type=float,
        help="each request's client-side time-out from its arrival; counted as 'timeout'",
    )
    p.add_argument(
        "--priority-mix",
        metavar="NAME=WEIGHT,...",
        help="send each request with a priority drawn from this mix, e.g. high=0.2,normal=0.8 "
        "(high, normal, low); reports success, latency and Jain's index per priority",
    )
    p.add_argument(
        "--scrape",
        metavar="URL",
        help="a Prometheus endpoint to read at every sample into the timeline (yieldgate's, "
        "vLLM's, TGI's...); a server started with --serve and an HTTP front is scraped anyway",
    )
    p.add_argument(
        "--no-scrape",
        action="store_true",
        help="do not scrape the /metrics of a server the tool started",
    )
    p.add_argument(
        "--recovery-probe-ms",
        type=float,
        metavar="MS",
        help="send a lone probe request every MS, before and after the burst, to measure "
        "the recovery of latency (the probes count in the server's counters)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of arrivals, prompts and jitter")
    p.add_argument(
        "--sample-ms", type=float, default=100.0, help="timeline sampling period (default 100)"
    )
    p.add_argument("--json", type=Path, metavar="PATH", help="write the results as JSON")
    p.add_argument(
        "--csv", type=Path, metavar="PATH", help="write one CSV row per strategy (per point)"
    )
    p.add_argument(
        "--plot",
        type=Path,
        metavar="PATH",
        help="write a PNG plot: the timelines, or for a sweep latency and goodput per point",
    )
    p.add_argument(
        "--html",
        type=Path,
        metavar="PATH",
        help="write one self-contained HTML report (tables, plots, config; fetches nothing)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--print-schema",
        nargs="?",
        const="burst",
        choices=["burst", "sweep"],
        help="print the JSON schema of --json (of one burst, or of a sweep) and exit",
    )
    add_log_level(p)
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


def _slo_flags(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for part in text.split(","):
        name, eq, value = part.strip().partition("=")
        if name not in ("ttft_ms", "tpot_ms", "e2e_ms") or not eq:
            raise ValueError(f"--slo: bad entry {part.strip()!r}: use ttft_ms=, tpot_ms=, e2e_ms=")
        try:
            out[name] = float(value)
        except ValueError:
            raise ValueError(f"--slo: {name} must be a number, got {value!r}") from None
    return out


def _burstiness(profile: Any, burstiness: float, sweep: Any) -> Any:
    from yieldgate.burst import ArrivalProfile

    if profile.kind == "poisson":
        return ArrivalProfile.gamma(profile.rate, burstiness)
    if profile.kind == "all-at-once" and sweep is not None and sweep.axis == "rate":
        # Each point replaces the rate; this one is never fired.
        return ArrivalProfile.gamma(1.0, burstiness)
    raise ValueError(
        "--burstiness needs Poisson arrivals to shape: --profile poisson:RATE or --sweep rate=..."
    )


def build_sweep(args: argparse.Namespace) -> Any:
    """``--sweep`` into a ``Sweep`` (``None`` without it); bad syntax raises ``CliError``."""
    if args.sweep is None:
        return None
    from yieldgate.burst import Sweep

    try:
        return Sweep.parse(args.sweep)
    except ValueError as exc:
        raise CliError(f"--sweep: {exc}") from None


def build_config(args: argparse.Namespace, sweep: Any = None) -> Any:
    """Flags (over a preset) into a ``BurstConfig``; bad values raise ``CliError``."""
    from yieldgate.burst import (
        PRESETS,
        ArrivalProfile,
        BurstConfig,
        Slo,
        Strategy,
        Workload,
    )
    from yieldgate.burst._metrics import parse_priority_mix
    from yieldgate.burst._strategies import compared_names
    from yieldgate.burst._targets import Target

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
            if settings["profile"].kind == "trace" and args.requests is None:
                settings["requests"] = len(settings["profile"].entries)
        if args.burstiness is not None:
            settings["profile"] = _burstiness(
                settings.get("profile", ArrivalProfile()), args.burstiness, sweep
            )
        if args.concurrency is not None:
            settings["concurrency"] = args.concurrency
        if args.workers is not None:
            settings["workers"] = args.workers
        if args.strategy is not None:
            names = [n.strip() for n in args.strategy.split(",") if n.strip()]
        elif args.compare:
            names = list(compared_names(Target.parse(str(settings["target"])).kind))
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
        given = _slo_flags(args.slo) if args.slo is not None else {}
        for name in ("ttft_ms", "tpot_ms", "e2e_ms"):
            flag = getattr(args, f"slo_{name}")
            if flag is not None:
                given[name] = flag
        settings["slo"] = Slo(**{**slo.as_dict(), **given})
        if args.dialect is not None:
            settings["dialect"] = args.dialect
        if args.wait_ready:
            settings["wait_ready"] = True
        settings["seed"] = args.seed
        settings["sample_interval_s"] = args.sample_ms / 1000
        if args.timeout_s is not None:
            settings["timeout_s"] = args.timeout_s
        if args.priority_mix is not None:
            settings["priority_mix"] = parse_priority_mix(args.priority_mix)
        if args.scrape is not None:
            settings["scrape"] = args.scrape
        if args.no_scrape:
            settings["scrape_auto"] = False
        if args.recovery_probe_ms is not None:
            settings["recovery_probe_s"] = args.recovery_probe_ms / 1000
        config = BurstConfig(**settings)
        for value in sweep.values if sweep is not None else ():
            sweep.point(config, value)  # a sweep the profile cannot take fails before firing
    except ValueError as exc:
        raise flag_error(exc, FLAGS) from None
    return config


def execute(
    config: Any,
    *,
    progress: bool,
    json_path: Path | None,
    plot_path: Path | None,
    csv_path: Path | None = None,
    sweep: Any = None,
    html_path: Path | None = None,
    comparison: str | None = None,
    stop: Any = None,
) -> Any:
    """Run ``config`` (at every point of ``sweep``, if given), print the tables, write the
    files; shared with ``yieldgate demo``. With ``comparison`` (a name), ``config`` is a
    list of ``(label, BurstConfig)`` parts run into one report.

    A signal (Ctrl-C) or a dead server or worker cuts the run short (``stop``, a
    ``yieldgate.burst._stop.Stop``): the files are written all the same, marked
    interrupted, and one line on standard error says why and where they are."""
    from yieldgate.burst import (
        SweepReport,
        render_table,
        run_burst,
        run_sweep,
        write_csv,
        write_plot,
    )
    from yieldgate.burst._stop import INTERRUPTED_STATUS, Stop
    from yieldgate.server import ServerStartError

    stop = stop or Stop()

    def go(bar: Any) -> Any:
        if comparison is not None:
            from yieldgate.burst._compare import run_comparison

            return run_comparison(config, name=comparison, progress=bar, stop=stop)
        if sweep is not None:
            return run_sweep(config, sweep, progress=bar, stop=stop)
        return run_burst(config, progress=bar, stop=stop)

    try:
        with stop.on_signals():
            if progress:
                with RichProgress() as bar:
                    report = go(bar)
            else:
                report = go(None)
    except MissingExtraError:
        raise
    except ServerStartError as exc:
        # Status 2: the server refused the flags --serve gave it; else it failed to start.
        raise (CliError if exc.returncode == 2 else CliFailure)(str(exc)) from None
    except (RuntimeError, ImportError, TimeoutError) as exc:
        raise CliFailure(str(exc)) from None
    if isinstance(report, SweepReport):
        for _, point in report.points:
            render_table(point)
    else:
        render_table(report)
    written: list[Path] = []
    if csv_path is not None:
        written.append(write_csv(report, csv_path))
        print(f"CSV written to {csv_path}")
    if json_path is not None:
        json_path.write_text(json.dumps(report.as_dict(), indent=1) + "\n", encoding="utf-8")
        written.append(json_path)
        print(f"results written to {json_path}")
    if plot_path is not None:
        written.append(write_plot(report, plot_path))
        print(f"plot written to {plot_path}")
    if html_path is not None:
        from yieldgate.burst import write_html

        written.append(write_html(report, html_path))
        print(f"HTML report written to {html_path}")
    if report.interrupted:
        died = stop.status != INTERRUPTED_STATUS
        print(checks.stopped_line("burst", report, died, written), file=sys.stderr, flush=True)
    return report


def run(args: argparse.Namespace) -> int:
    if args.print_schema:
        from yieldgate.burst import SCHEMA, SWEEP_SCHEMA

        print(json.dumps(SWEEP_SCHEMA if args.print_schema == "sweep" else SCHEMA, indent=1))
        return 0
    check_extra("the burst tool")
    check_outputs(
        [("--json", args.json), ("--csv", args.csv), ("--plot", args.plot), ("--html", args.html)]
    )
    sweep = build_sweep(args)
    from yieldgate.burst._presets import COMPARISONS

    comparison = args.preset if args.preset in COMPARISONS else None
    if comparison is not None:
        if sweep is not None:
            raise CliError(f"--preset {comparison} runs several presets: it takes no --sweep")
        config: Any = [
            (label, build_config(argparse.Namespace(**{**vars(args), "preset": preset})))
            for label, preset in COMPARISONS[comparison]
        ]
    else:
        config = build_config(args, sweep)
    checks.check_packages([part for _, part in config] if comparison is not None else [config])
    from yieldgate.burst._stop import Stop

    report = execute(
        config,
        comparison=comparison,
        progress=not args.no_progress,
        json_path=args.json,
        plot_path=args.plot,
        csv_path=args.csv,
        sweep=sweep,
        html_path=args.html,
        stop=(stop := Stop()),
    )
    if stop.is_set():
        return stop.status
    checks.check_reached(report)
    return 0
