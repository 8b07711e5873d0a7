"""``BurstConfig``: what a burst is asked to do, and what follows from it alone.

Besides the config: the prompts its requests send (``burst_prompts``), the
ramp of a server it starts (``sim_ramp``) and its report, stamped with the
machine and the time (``burst_report``). A module of its own because both
drivers of a burst read them: ``_runner`` (one process) and ``_workers``
(several), and the runner starts the workers, which must not import it back.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import yieldgate
from yieldgate.burst._profiles import ArrivalProfile
from yieldgate.burst._results import BurstReport, Goal, Slo, StrategyResult
from yieldgate.burst._strategies import Strategy
from yieldgate.burst._targets import Target, Workload

__all__ = ["BurstConfig", "burst_prompts", "burst_report", "sim_ramp"]


@dataclass(frozen=True, slots=True, kw_only=True)
class BurstConfig:
    """One burst, run once per strategy.

    ``target`` is a URL (``tcp://HOST:PORT``, ``openai+http://...``,
    ``hf+http://...``, ``tgi+http://...``, ``raw+http://...``). With ``serve_args`` the tool
    starts ``yieldgate serve ARGS`` itself, fresh for each strategy, and the
    target may be a bare scheme (``tcp://``). Without it every strategy meets
    the same server, in whatever state the one before left it.

    ``concurrency`` caps the requests the generator keeps outstanding (as
    vLLM's ``--max-concurrency``): an arrival waits for one to end, and its
    clock (latency, TTFT) starts when it is sent. ``None``: no cap.

    ``timeout_s``: each request's client-side time-out, from its arrival (its
    sending, in a closed loop); a request still unanswered then is cancelled and
    counts as failed with the kind ``timeout``. ``priority_mix``: weights of
    ``high`` / ``normal`` / ``low`` drawn per request and sent as its priority
    (the Gate call's and the server's). ``scrape``: a Prometheus endpoint read
    at every sample into the timeline; ``scrape_auto`` scrapes a server the tool
    started itself when it has an HTTP front. ``recovery_probe_s``: sends a
    quiet probe that often, before and after the burst, for the recovery time
    (docs/burst.md).
    ``workers`` > 1 sends the burst from that many processes, each its share
    of every strategy's requests, into one merged report (``_workers``).
    """

    target: str
    requests: int = 100
    profile: ArrivalProfile = field(default_factory=ArrivalProfile)
    strategies: tuple[Strategy, ...] = (Strategy(name="yieldgate"),)
    workload: Workload = field(default_factory=Workload)
    slo: Slo = field(default_factory=Slo)
    serve_args: tuple[str, ...] | None = None
    dialect: str | None = None
    wait_ready: bool = False
    ready_timeout_s: float = 120.0
    seed: int = 0
    sample_interval_s: float = 0.1
    scenario: str | None = None
    goal: Goal | None = None
    concurrency: int | None = None
    timeout_s: float | None = None
    priority_mix: tuple[tuple[str, float], ...] = ()
    scrape: str | None = None
    scrape_auto: bool = True
    recovery_probe_s: float | None = None
    recovery_limit_s: float = 30.0
    baseline_probes: int = 5
    workers: int = 1

    def __post_init__(self) -> None:
        if self.requests < 1:
            raise ValueError("requests must be >= 1")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        if self.workers < 1:
            raise ValueError("workers must be >= 1")
        if self.concurrency is not None and self.concurrency < self.workers:
            raise ValueError("concurrency must be >= workers (each worker needs one slot)")
        if self.profile.kind == "trace" and self.requests > len(self.profile.entries):
            raise ValueError(
                f"the trace has {len(self.profile.entries)} requests, fewer than {self.requests}"
            )
        if not self.strategies:
            raise ValueError("give at least one strategy")
        if not (self.sample_interval_s > 0 and math.isfinite(self.sample_interval_s)):
            raise ValueError("sample_interval_s must be > 0")
        if self.timeout_s is not None and not (
            self.timeout_s > 0 and math.isfinite(self.timeout_s)
        ):
            raise ValueError("timeout_s must be a finite number > 0")
        if self.recovery_probe_s is not None and not (
            self.recovery_probe_s > 0 and math.isfinite(self.recovery_probe_s)
        ):
            raise ValueError("recovery_probe_s must be a finite number > 0")
        if not (self.recovery_limit_s > 0 and math.isfinite(self.recovery_limit_s)):
            raise ValueError("recovery_limit_s must be a finite number > 0")
        if self.baseline_probes < 1:
            raise ValueError("baseline_probes must be >= 1")
        for name, weight in self.priority_mix:
            if name not in ("high", "normal", "low") or not (weight > 0 and math.isfinite(weight)):
                raise ValueError("priority_mix takes high, normal, low with weights > 0")
        if self.workers > 1 and (self.scrape is not None or self.recovery_probe_s is not None):
            raise ValueError(
                "scraping and recovery probes run in one process: not with workers > 1 (yet)"
            )
        if self.scrape is not None and not self.scrape.startswith(("http://", "https://")):
            raise ValueError(f"scrape {self.scrape!r}: give an http:// URL of a metrics endpoint")
        target = Target.parse(self.target)
        if self.serve_args is None:
            target.require_address()
        if target.kind == "hf" and self.priority_mix:
            raise ValueError(
                "an hf+http:// target cannot send priorities (its client takes no headers)"
            )
        if target.kind == "hf" and self.recovery_probe_s is not None:
            raise ValueError(
                "an hf+http:// target cannot be probed (huggingface_hub's client factory is global)"
            )

    def as_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "target": self.target,
            "requests": self.requests,
            "concurrency": self.concurrency,
            "profile": self.profile.as_dict(),
            "strategies": [s.label for s in self.strategies],
            "stream": self.workload.stream,
            "prompt_tokens": [[t, w] for t, w in self.workload.prompt_tokens],
            "max_tokens": self.workload.max_tokens,
            "model": self.workload.model,
            "dialect": self.dialect,
            "slo": self.slo.as_dict(),
            "serve_args": None if self.serve_args is None else list(self.serve_args),
            "fresh_server_per_strategy": self.serve_args is not None,
            "wait_ready": self.wait_ready,
            "seed": self.seed,
            "sample_interval_s": self.sample_interval_s,
            "timeout_s": self.timeout_s,
            "priority_mix": [[name, weight] for name, weight in self.priority_mix],
            "scrape": self.scrape,
            "recovery_probe_s": self.recovery_probe_s,
            "workers": self.workers,
        }


def burst_prompts(config: BurstConfig) -> list[str]:
    """The workload's prompts, each replaced by its trace entry's own where it has one."""
    prompts = config.workload.prompts(config.requests, config.seed)
    for i, entry in enumerate(config.profile.entries[: config.requests]):
        if entry.prompt is not None:
            prompts[i] = entry.prompt
        elif entry.prompt_chars is not None:
            prompts[i] = config.workload.prompt_of_length(i, entry.prompt_chars)
    return prompts


def sim_ramp(serve_args: Sequence[str] | None) -> tuple[float, float]:
    """The ``--cold-start-s`` and ``--ramp-s`` a started server was given (for the bound)."""
    if serve_args is None:
        return 0.0, 0.0
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--cold-start-s", type=float, default=0.0)
    parser.add_argument("--ramp-s", type=float, default=0.0)
    known, _ = parser.parse_known_args(list(serve_args))
    return known.cold_start_s, known.ramp_s


def burst_report(
    config: BurstConfig, results: Sequence[StrategyResult], stopped_by: str | None = None
) -> BurstReport:
    """The report of ``config``'s run: its results, stamped with the machine and the time.
    Cut short (``stopped_by``), the strategies without a complete result are unfinished."""
    done = {r.label for r in results if r.complete}
    return BurstReport(
        stopped_by=stopped_by,
        unfinished=tuple(s.label for s in config.strategies if s.label not in done)
        if stopped_by is not None
        else (),
        config=config.as_dict(),
        machine=_machine(),
        created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        results=tuple(results),
        goal=config.goal,
    )


def _machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "yieldgate": yieldgate.__version__,
    }
