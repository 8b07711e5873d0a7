"""Sweeps: the same burst at several arrival rates or concurrencies, one point per value.

``AXIS=VALUES``, where AXIS is ``rate`` (requests/s of a Poisson or gamma
profile) or ``concurrency`` (requests the generator keeps outstanding), and
VALUES is a comma-separated list (``rate=1,2,4,8``) or a range
``START:STOP:STEP``, inclusive of STOP when a step lands on it, STEP ``+N``
(add N: ``concurrency=4:16:+4`` is 4, 8, 12, 16) or ``xN`` (multiply by N:
``rate=1:16:x2`` is 1, 2, 4, 8, 16). Every point runs the whole burst, with
the same seed: the points differ only in the swept value.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from yieldgate.burst._config import BurstConfig
from yieldgate.burst._progress import Progress, Relabelled
from yieldgate.burst._results import SWEEP_SCHEMA_ID, BurstReport, StrategyResult
from yieldgate.burst._runner import run_burst
from yieldgate.burst._stop import Stop

__all__ = ["Sweep", "SweepAxis", "SweepReport", "run_sweep"]

SweepAxis = Literal["rate", "concurrency"]
_MAX_POINTS = 100


def _number(text: str, spec: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"sweep {spec!r}: {text.strip()!r} is not a number") from None
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"sweep {spec!r}: values must be finite numbers > 0, got {text.strip()}")
    return value


def _range(start: float, stop: float, step: str, spec: str) -> list[float]:
    op, amount = step[:1], step[1:]
    if op not in ("+", "x"):
        raise ValueError(f"sweep {spec!r}: the step must be +N (add) or xN (multiply)")
    by = _number(amount, spec)
    if op == "x" and by <= 1:
        raise ValueError(f"sweep {spec!r}: a multiplying step must be > 1")
    if stop < start:
        raise ValueError(f"sweep {spec!r}: STOP is below START")
    values: list[float] = []
    k = 0
    while True:
        # From START each time, so repeated addition cannot drift past STOP.
        value = start + k * by if op == "+" else start * by**k
        if value > stop * (1 + 1e-9):
            return values
        values.append(round(value, 9))
        k += 1
        if len(values) > _MAX_POINTS:
            raise ValueError(f"sweep {spec!r}: more than {_MAX_POINTS} points")


@dataclass(frozen=True, slots=True, kw_only=True)
class Sweep:
    """The axis and the values of a sweep; ``Sweep.parse("rate=1:16:x2")``."""

    axis: SweepAxis
    values: tuple[float, ...]

    def __post_init__(self) -> None:
        if self.axis not in ("rate", "concurrency"):
            raise ValueError(f"unknown sweep axis {self.axis!r}: use rate or concurrency")
        if not self.values:
            raise ValueError("a sweep needs at least one value")
        if len(self.values) > _MAX_POINTS:
            raise ValueError(f"a sweep has at most {_MAX_POINTS} points")
        if len(set(self.values)) != len(self.values):
            raise ValueError("a sweep's values must differ")
        for value in self.values:
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"sweep values must be finite numbers > 0, got {value!r}")
            if self.axis == "concurrency" and value != int(value):
                raise ValueError(f"a concurrency must be a whole number, got {value:g}")

    @classmethod
    def parse(cls, text: str) -> Sweep:
        """``rate=1,2,4,8``, ``rate=1:16:x2``, ``concurrency=4:16:+4`` (module docstring)."""
        axis, eq, values = text.strip().partition("=")
        axis = axis.strip().lower()
        if not eq or not values.strip():
            raise ValueError(f"sweep {text!r}: use AXIS=VALUES, e.g. rate=1,2,4 or rate=1:16:x2")
        if axis not in ("rate", "concurrency"):
            raise ValueError(f"sweep {text!r}: unknown axis {axis!r}: use rate or concurrency")
        if ":" in values:
            parts = values.split(":")
            if len(parts) != 3:
                raise ValueError(f"sweep {text!r}: a range is START:STOP:+N or START:STOP:xN")
            start, stop = _number(parts[0], text), _number(parts[1], text)
            numbers = _range(start, stop, parts[2].strip().lower(), text)
        else:
            numbers = [_number(v, text) for v in values.split(",")]
        return cls(axis=axis, values=tuple(numbers))  # type: ignore[arg-type]

    def describe(self) -> str:
        return f"{self.axis}=" + ",".join(f"{v:g}" for v in self.values)

    def point(self, config: BurstConfig, value: float) -> BurstConfig:
        """``config`` at one value of the sweep."""
        if self.axis == "rate":
            return dataclasses.replace(config, profile=config.profile.with_rate(value))
        return dataclasses.replace(config, concurrency=int(value))


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepReport:
    """A whole sweep: the base configuration and one ``BurstReport`` per value."""

    sweep: Sweep
    config: Mapping[str, Any]
    machine: Mapping[str, Any]
    created: str
    points: tuple[tuple[float, BurstReport], ...]
    # Why the sweep was cut short (``yieldgate.burst._stop``), and the values never run.
    stopped_by: str | None = None
    unfinished_points: tuple[float, ...] = ()

    @property
    def interrupted(self) -> bool:
        return self.stopped_by is not None

    def rows(self) -> list[tuple[float, StrategyResult]]:
        """``(value, result)`` for every strategy of every point, in the order run."""
        return [(value, r) for value, report in self.points for r in report.results]

    def as_dict(self, *, timeline: bool = True) -> dict[str, Any]:
        return {
            "schema": SWEEP_SCHEMA_ID,
            "created": self.created,
            "sweep": {
                "axis": self.sweep.axis,
                "values": list(self.sweep.values),
                "spec": self.sweep.describe(),
            },
            "config": dict(self.config),
            "machine": dict(self.machine),
            "interrupted": self.interrupted,
            "stopped_by": self.stopped_by,
            "unfinished_points": list(self.unfinished_points),
            "points": [
                {
                    "value": value,
                    "config": dict(report.config),
                    "goal": None if report.goal is None else report.goal.as_dict(),
                    "unfinished": list(report.unfinished),
                    "results": [r.as_dict(timeline=timeline) for r in report.results],
                }
                for value, report in self.points
            ],
        }


def run_sweep(
    config: BurstConfig,
    sweep: Sweep,
    *,
    progress: Progress | None = None,
    stop: Stop | None = None,
) -> SweepReport:
    """Run ``config`` at every value of ``sweep``, in order (each point as ``run_burst``
    runs it: with ``serve_args``, a fresh server per strategy per point). Cut short by
    ``stop``, it returns the points run so far (``SweepReport.stopped_by``)."""
    points = [(value, sweep.point(config, value)) for value in sweep.values]  # fail before firing
    stop = stop or Stop()
    reports: list[tuple[float, BurstReport]] = []
    for value, point in points:
        if stop.is_set() and reports:
            break
        shown = None if progress is None else Relabelled(progress, after=f" {sweep.axis}={value:g}")
        reports.append((value, run_burst(point, progress=shown, stop=stop)))
    return SweepReport(
        stopped_by=stop.reason,
        unfinished_points=tuple(value for value, _ in points[len(reports) :]),
        sweep=sweep,
        config=config.as_dict(),
        machine=reports[0][1].machine,
        created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        points=tuple(reports),
    )
