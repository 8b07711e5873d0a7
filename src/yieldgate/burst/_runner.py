"""Running a burst: each strategy in turn, from this process or from a pool of them.

``run_burst`` is the entry point. With ``BurstConfig.workers`` > 1 it hands the
run to the worker pool (``_workers``), imported only then: importing
``yieldgate.burst`` loads no ``multiprocessing``. What one strategy's run does
is ``_strategy_run``; the config, its prompts and the report ``_config``.
"""

from __future__ import annotations

import functools

from yieldgate.burst._config import BurstConfig, burst_prompts, burst_report
from yieldgate.burst._progress import Progress, Silent
from yieldgate.burst._results import BurstReport, StrategyResult
from yieldgate.burst._stop import Stop
from yieldgate.burst._strategy_run import live_server, run_async, run_one
from yieldgate.burst._targets import Target

__all__ = ["run_burst"]


def run_burst(
    config: BurstConfig, *, progress: Progress | None = None, stop: Stop | None = None
) -> BurstReport:
    """Run ``config`` once per strategy, in order, and return the report.

    ``stop`` (``yieldgate.burst._stop``) cuts the run short: the strategy running then
    ends with what it measured, marked incomplete, and no other starts. A server the
    tool started that dies mid-run cuts it short too (with or without ``stop``); the
    report says why (``BurstReport.stopped_by``).
    """
    progress = progress or Silent()
    stop = stop or Stop()
    if config.workers > 1:
        # Here, not at the top: the pool brings multiprocessing, for this case only.
        from yieldgate.burst._workers import run_workers

        return run_workers(config, progress, stop)
    target = Target.parse(config.target)
    offsets = config.profile.offsets(config.requests, seed=config.seed)
    prompts = burst_prompts(config)
    results: list[StrategyResult] = []
    for n, strategy in enumerate(config.strategies):
        if stop.check():
            break
        with live_server(config, target, stop) as live:
            progress.start(strategy.label, config.requests)
            one = functools.partial(run_one, stop=stop)
            result = run_async(one, config, strategy, live, offsets, prompts, n, progress)
            progress.finish(result)
        results.append(result)
    return burst_report(config, results, stop.reason)
