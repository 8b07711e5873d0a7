"""yieldgate.burst: fire arrival profiles at a target and report what happened.

Needs the ``burst`` extra (rich, matplotlib); ``import yieldgate`` never
imports this package. It uses only the public SDK, as a user would: the
``yieldgate`` strategy is a ``Gate``, the baselines are what people use today
(no retry, tenacity, the official openai client's policy), and servers it
starts itself are ``yieldgate serve`` processes. docs/burst.md is the guide.

>>> config = BurstConfig(target="tcp://", serve_args=("--max-inflight", "8"),
...                      strategies=(Strategy(name="yieldgate"), Strategy(name="naive")))
>>> report = run_burst(config)  # doctest: +SKIP
>>> render_table(report)  # doctest: +SKIP
"""

from yieldgate.burst._compare import run_comparison
from yieldgate.burst._config import BurstConfig
from yieldgate.burst._csv import CSV_COLUMNS, write_csv
from yieldgate.burst._html import write_html
from yieldgate.burst._plot import write_plot
from yieldgate.burst._presets import COMPARISONS, PRESETS, demo_settings
from yieldgate.burst._profiles import ArrivalProfile
from yieldgate.burst._progress import Progress
from yieldgate.burst._report import markdown_table, render_table, summary_line
from yieldgate.burst._results import (
    SCHEMA_ID,
    SWEEP_SCHEMA_ID,
    BurstReport,
    Goal,
    Percentiles,
    ServerCounters,
    Slo,
    StrategyResult,
    TimelinePoint,
    makespan_lower_bound,
)
from yieldgate.burst._runner import run_burst
from yieldgate.burst._schema import SCHEMA, SWEEP_SCHEMA
from yieldgate.burst._strategies import STRATEGY_NAMES, Strategy, load_policy
from yieldgate.burst._sweep import Sweep, SweepReport, run_sweep
from yieldgate.burst._targets import Target, Workload

__all__ = [
    "COMPARISONS",
    "CSV_COLUMNS",
    "PRESETS",
    "SCHEMA",
    "SCHEMA_ID",
    "STRATEGY_NAMES",
    "SWEEP_SCHEMA",
    "SWEEP_SCHEMA_ID",
    "ArrivalProfile",
    "BurstConfig",
    "BurstReport",
    "Goal",
    "Percentiles",
    "Progress",
    "ServerCounters",
    "Slo",
    "Strategy",
    "StrategyResult",
    "Sweep",
    "SweepReport",
    "Target",
    "TimelinePoint",
    "Workload",
    "demo_settings",
    "load_policy",
    "makespan_lower_bound",
    "markdown_table",
    "render_table",
    "run_burst",
    "run_comparison",
    "run_sweep",
    "summary_line",
    "write_csv",
    "write_html",
    "write_plot",
]
