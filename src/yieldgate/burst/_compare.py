"""Several presets (or configurations) run one after the other into one report.

``run_comparison(parts)`` runs each ``(label, BurstConfig)`` with
``run_burst`` and returns one ``BurstReport`` whose results are every part's,
in order, each labelled ``PART: strategy`` (``buffering: naive``,
``governed: naive``...). The report's ``config`` is the first part's, with
the comparison's name as its scenario and every part's own configuration
under ``parts``.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Sequence
from typing import Any

from yieldgate.burst._config import BurstConfig
from yieldgate.burst._progress import Progress, Relabelled
from yieldgate.burst._results import BurstReport
from yieldgate.burst._runner import run_burst
from yieldgate.burst._stop import Stop

__all__ = ["run_comparison"]


def run_comparison(
    parts: Sequence[tuple[str, BurstConfig]],
    *,
    name: str,
    progress: Progress | None = None,
    stop: Stop | None = None,
) -> BurstReport:
    """Run every part in order; one report with each result labelled by its part. Cut
    short (``stop``), the parts not run are unfinished too."""
    if not parts:
        raise ValueError("a comparison needs at least one part")
    labels = [label for label, _ in parts]
    if len(set(labels)) != len(labels):
        raise ValueError("a comparison's parts need different labels")
    stop = stop or Stop()
    reports: list[tuple[str, BurstReport]] = []
    unfinished: list[str] = []
    for label, part in parts:
        if stop.is_set() and reports:
            unfinished.extend(f"{label}: {s.label}" for s in part.strategies)
            continue
        shown = None if progress is None else Relabelled(progress, before=f"{label}: ")
        report = run_burst(part, progress=shown, stop=stop)
        unfinished.extend(f"{label}: {name}" for name in report.unfinished)
        reports.append((label, report))
    results = tuple(
        dataclasses.replace(r, label=f"{label}: {r.label}")
        for label, report in reports
        for r in report.results
    )
    config: dict[str, Any] = dict(reports[0][1].config)
    config["scenario"] = name
    config["strategies"] = [r.label for r in results]
    config["parts"] = [{"label": label, **report.config} for label, report in reports]
    return BurstReport(
        config=config,
        machine=reports[0][1].machine,
        created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        results=results,
        goal=reports[0][1].goal,
        stopped_by=stop.reason,
        unfinished=tuple(unfinished),
    )
