"""The plot: inflight, yields and completions over time, one line per strategy."""

from __future__ import annotations

from pathlib import Path

from yieldgate.burst._results import BurstReport

__all__ = ["write_plot"]


def write_plot(report: BurstReport, path: str | Path) -> Path:
    """Write a PNG of ``report``'s timelines to ``path`` (matplotlib, no display needed).

    The server's counters are plotted when every strategy had them; otherwise
    the client's own (attempts in flight through its Gate, yields it saw).
    """
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
    for r in report.results:
        t = [p.t_s for p in r.timeline]
        if server:
            inflight = [p.server_inflight or 0 for p in r.timeline]
            yields = [p.server_yielded or 0 for p in r.timeline]
        else:
            inflight = [p.client_inflight for p in r.timeline]
            yields = [p.client_yields for p in r.timeline]
        done = [p.completed for p in r.timeline]
        axes[0].step(t, inflight, where="post", label=r.label)
        axes[1].plot(t, yields, label=r.label)
        axes[2].plot(t, done, label=r.label)
    for ax, title in zip(axes, titles, strict=True):
        ax.set_title(title, loc="left", fontsize=10)
        ax.grid(alpha=0.3)
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
