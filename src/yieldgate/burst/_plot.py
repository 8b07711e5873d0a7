"""The plots: a burst's timelines (inflight, yields, completions over time, one line per
strategy), or a sweep's latency and goodput against the swept value."""

from __future__ import annotations

from pathlib import Path

from yieldgate.burst._html_plots import plot_colors, plot_styles
from yieldgate.burst._results import BurstReport
from yieldgate.burst._sweep import SweepReport

__all__ = ["write_plot"]


def write_plot(report: BurstReport | SweepReport, path: str | Path) -> Path:
    """Write a PNG of ``report`` to ``path`` (matplotlib, no display needed).

    A sweep: end-to-end latency (p50 and p99) and goodput against the swept
    value, one line per strategy. A burst: its timelines; the server's counters
    are plotted when every strategy had them; otherwise the client's own
    (attempts in flight through its Gate, yields it saw).
    """
    if isinstance(report, SweepReport):
        return _write_sweep_plot(report, Path(path))
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    server = all(r.timeline and r.timeline[0].server_inflight is not None for r in report.results)
    fig = Figure(figsize=(9, 8), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(3, 1, sharex=True)
    where = "server" if server else "client"
    titles = (
        f"in flight ({where})",
        f"yields, cumulative ({where})",
        "completed requests, cumulative",
    )
    styles = plot_styles(plot_colors(r.label for r in report.results))
    for r in report.results:
        st = styles[r.label]
        line = {"c": st["color"], "ls": st["ls"], "lw": st["lw"], "zorder": st["zorder"]}
        t = [p.t_s for p in r.timeline]
        if server:
            inflight = [p.server_inflight or 0 for p in r.timeline]
            yields = [p.server_yielded or 0 for p in r.timeline]
        else:
            inflight = [p.client_inflight for p in r.timeline]
            yields = [p.client_yields for p in r.timeline]
        done = [p.completed for p in r.timeline]
        axes[0].step(t, inflight, where="post", label=r.label, **line)
        axes[1].plot(t, yields, label=r.label, **line)
        axes[2].plot(t, done, label=r.label, **line)
    for ax, title in zip(axes, titles, strict=True):
        ax.set_title(title, loc="left", fontsize=10)
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
    if server and report.results and report.results[0].server is not None:
        cap = report.results[0].server.max_inflight
        axes[0].axhline(cap, color="grey", linestyle="--", linewidth=1, label="max_inflight")
    axes[0].legend(loc="upper right", fontsize=8)
    axes[2].set_xlabel("seconds since the first arrival")
    c = report.config
    title = f"{c.get('scenario') or 'burst'}: {c['requests']} requests, {c['profile']['spec']}"
    if c.get("stream"):
        title += ", streamed"
    if c.get("serve_args"):
        title += "\nyieldgate serve " + " ".join(c["serve_args"])
    fig.suptitle(title, fontsize=10)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    return out


def _write_sweep_plot(report: SweepReport, out: Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 7), layout="constrained")
    FigureCanvasAgg(fig)
    latency, goodput = fig.subplots(2, 1, sharex=True)
    labels = list(dict.fromkeys(r.label for _, r in report.rows()))
    for label in labels:
        points = [(v, r) for v, r in report.rows() if r.label == label]
        xs = [v for v, _ in points]
        p50 = [r.latency_s.p50 for _, r in points]
        p99 = [r.latency_s.p99 for _, r in points]
        (line,) = latency.plot(xs, p50, marker="o", label=label)
        latency.plot(xs, p99, marker="o", linestyle="--", color=line.get_color())
        goodput.plot(xs, [r.goodput_per_s for _, r in points], marker="o", label=label)
    latency.set_title("end-to-end latency of successes, s (solid p50, dashed p99)", loc="left")
    goodput.set_title("goodput: requests meeting every SLO, per second", loc="left")
    for ax in (latency, goodput):
        ax.grid(alpha=0.3)
        ax.title.set_fontsize(10)
    latency.legend(loc="upper left", fontsize=8)
    axis = report.sweep.axis
    goodput.set_xlabel("arrival rate, requests/s" if axis == "rate" else "concurrency")
    c = report.config
    title = f"sweep {report.sweep.describe()}: {c['requests']} requests a point"
    if c.get("serve_args"):
        title += "\nyieldgate serve " + " ".join(c["serve_args"])
    fig.suptitle(title, fontsize=10)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    return out
