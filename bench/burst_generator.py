"""Benchmark: how many requests per second ``yieldgate burst`` can generate, against Locust.

What it measures. One ``yieldgate serve --exec-ms 0`` (it answers at once:
the sleep backend echoes, with no sleep), with its HTTP front, serves every
generator in turn, in the same run:

- ``yieldgate burst`` with 1 and with 2 worker processes (``--workers``),
  closed loop (``--concurrency``): through the lean HTTP client of the
  ``raw+http://`` target, with the ``naive`` strategy (one attempt per
  request, no retry: the generator's own cost) and with the ``yieldgate``
  strategy (a real Gate classifying every reply); and, strategy ``naive``,
  through the official openai client
  (``openai+http://``), through plain httpx (``tgi+http://``) and, for
  reference, through yieldgate's own ``GovernedClient`` on the server's TCP
  port (``tcp://``, the governed protocol: not HTTP, so not Locust's work);
- Locust, headless, one process, users posting the same chat completion back
  to back: ``FastHttpUser`` (geventhttpclient) and ``HttpUser`` (requests),
  and ``yieldgate.burst.locust.YieldgateFastHttpUser`` with the ``naive`` and
  the ``yieldgate`` strategies (Locust needs yieldgate installed beside it).

Each generator runs as a child process in a session of its own. While it
runs, the bench samples the server's ``executed_total`` (``GET /stats``)
and the CPU seconds of every process of the generator's session (the
burst's workers included) from ``/proc``. The measured window is the middle
of the run, between 10% and 90% of the requests the server executed, so
start-up and the tail are left out, whichever tool it is. Per generator:

- rate: requests the server executed per second in the window;
- generator CPU: CPU seconds its processes used per second of the window
  (1.0 is one core busy);
- per core: requests per CPU second of the generator (rate / generator CPU),
  the figure compared across tools (issue 21's goal: >= 1.5x Locust's).

inference-perf is not measured: it needs Python >= 3.12 and this project
runs on 3.11.

Run it (from the repository root; Locust in a venv of its own)::

    .venv/bin/python bench/burst_generator.py --locust /tmp/venv-locust/bin/locust
    .venv/bin/python bench/burst_generator.py --requests 6000 --seconds 6 --concurrency 64
    .venv/bin/python bench/burst_generator.py --only-raw --locust /tmp/venv-locust/bin/locust

The ``raw+http://`` rows send 4x ``--requests`` (they are that much faster).

All traffic stays on 127.0.0.1. Exit status 0 unless a generator failed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from _common import add_smoke_flag, smoke
from yieldgate.server import ServerProcess, spawn

LOCUSTFILE = """\
from locust import FastHttpUser, HttpUser, constant, task

BODY = {{"model": "yieldgate-sim", "messages": [{{"role": "user", "content": "request 1"}}]}}


class Plain{kind}({kind}):
    wait_time = constant(0)

    @task
    def chat(self):
        self.client.post("/v1/chat/completions", json=BODY)
"""
STRATEGIC = "from yieldgate.burst.locust import YieldgateFastHttpUser  # noqa: F401\n"
_SAMPLE_S = 0.05
_TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class Sample:
    t: float
    executed: int
    cpu_s: float
    server_cpu_s: float


@dataclass(frozen=True, slots=True)
class Measured:
    name: str
    processes: int
    rate: float
    cpu: float
    server_cpu: float
    requests: int
    status: int

    @property
    def per_core(self) -> float:
        return self.rate / self.cpu if self.cpu > 0 else 0.0


def _proc_cpu(pid: int) -> tuple[int, float] | None:
    """(session id, user + system CPU seconds) of ``pid``; ``None`` if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()
    return int(fields[3]), (int(fields[11]) + int(fields[12])) / _TICK


def session_cpu_s(session: int) -> float:
    """CPU seconds of every live process of ``session``."""
    total = 0.0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            found = _proc_cpu(int(entry.name))
            if found is not None and found[0] == session:
                total += found[1]
    return total


def executed(server: ServerProcess) -> int:
    return int(httpx.get(f"{server.http_url}/stats", timeout=10).json()["executed_total"])


def measure(
    name: str, processes: int, command: Sequence[str], server: ServerProcess, cwd: Path
) -> Measured:
    """Run ``command`` to its end, sampling the server and the generator's CPU."""
    samples: list[Sample] = []
    child = subprocess.Popen(
        list(command),
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    stop = threading.Event()

    def sampler() -> None:
        while not stop.is_set():
            server_cpu = _proc_cpu(server.pid)
            samples.append(
                Sample(
                    time.monotonic(),
                    executed(server),
                    session_cpu_s(child.pid),
                    0.0 if server_cpu is None else server_cpu[1],
                )
            )
            stop.wait(_SAMPLE_S)

    thread = threading.Thread(target=sampler, daemon=True)
    thread.start()
    try:
        _, stderr = child.communicate(timeout=600)
    finally:
        stop.set()
        thread.join()
        if child.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    if child.returncode != 0:
        print(f"{name}: exit status {child.returncode}\n{stderr[-2000:]}", file=sys.stderr)
    return window(name, processes, samples, child.returncode)


def window(name: str, processes: int, samples: Sequence[Sample], status: int) -> Measured:
    """The figures between 10% and 90% of the requests executed during the run."""
    if len(samples) < 2:
        return Measured(name, processes, 0.0, 0.0, 0.0, 0, status)
    first, total = samples[0].executed, samples[-1].executed - samples[0].executed
    lo = next(s for s in samples if s.executed - first >= 0.1 * total)
    hi = [s for s in samples if s.executed - first <= 0.9 * total][-1]
    if hi.t <= lo.t:
        return Measured(name, processes, 0.0, 0.0, 0.0, total, status)
    span = hi.t - lo.t
    return Measured(
        name=name,
        processes=processes,
        rate=(hi.executed - lo.executed) / span,
        cpu=(hi.cpu_s - lo.cpu_s) / span,
        server_cpu=(hi.server_cpu_s - lo.server_cpu_s) / span,
        requests=total,
        status=status,
    )


def burst_command(
    scheme: str,
    server: ServerProcess,
    workers: int,
    requests: int,
    concurrency: int,
    strategy: str = "naive",
) -> list[str]:
    assert server.http_address is not None
    host, port = (server.host, server.port) if scheme == "tcp" else server.http_address
    return [
        sys.executable,
        "-m",
        "yieldgate",
        "burst",
        "--target",
        f"{scheme}://{host}:{port}",
        "--strategy",
        strategy,
        "--requests",
        str(requests),
        "--concurrency",
        str(concurrency),
        "--workers",
        str(workers),
        "--no-progress",
    ]


def locust_command(
    locust: str, locustfile: str, server: ServerProcess, seconds: float, users: int
) -> list[str]:
    return [
        locust,
        "-f",
        locustfile,
        "--headless",
        "--only-summary",
        f"--users={users}",
        f"--spawn-rate={users}",
        f"--run-time={seconds:g}s",
        f"--host={server.http_url}",
        "--loglevel=WARNING",
        "--exit-code-on-error=0",
    ]


@contextlib.contextmanager
def governed() -> Iterator[ServerProcess]:
    with spawn("--exec-ms", "0", "--max-inflight", "4096", http=True) as server:
        yield server


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=4000, help="per burst run (4000)")
    parser.add_argument("--seconds", type=float, default=5.0, help="per Locust run (5)")
    parser.add_argument("--concurrency", type=int, default=32, help="requests outstanding (32)")
    parser.add_argument(
        "--locust",
        default=os.environ.get("YIELDGATE_LOCUST") or shutil.which("locust"),
        help="the locust command (default: $YIELDGATE_LOCUST, else locust on PATH)",
    )
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument(
        "--only-raw",
        action="store_true",
        help="of the burst rows, only the raw+http:// ones (the others take long)",
    )
    add_smoke_flag(parser)
    args = parser.parse_args()
    quick = smoke(args)
    if quick:  # one worker per client, a few hundred requests, a second of Locust
        args.requests, args.seconds, args.concurrency = 500, 1.0, 8

    print(
        f"machine: {os.cpu_count()} CPUs, {platform.machine()}, Python {platform.python_version()}"
    )
    print(
        f"server: yieldgate serve --exec-ms 0 --max-inflight 4096 (HTTP); "
        f"{args.concurrency} outstanding requests per generator"
    )
    print("inference-perf: not run (it needs Python >= 3.12; this is Python 3.11)")
    rows: list[Measured] = []
    with governed() as server, tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        for kind in ("FastHttpUser", "HttpUser"):
            (cwd / f"plain_{kind.lower()}.py").write_text(LOCUSTFILE.format(kind=kind))
        (cwd / "strategic.py").write_text(STRATEGIC)
        runs: list[tuple[str, int, list[str]]] = []
        for scheme, client, strategy in (
            ("raw+http", "raw HTTP", "naive"),
            ("raw+http", "raw HTTP", "yieldgate"),
            ("openai+http", "openai client", "naive"),
            ("tgi+http", "httpx", "naive"),
            ("tcp", "GovernedClient", "naive"),
        ):
            if args.only_raw and scheme != "raw+http":
                continue
            # The lean client is fast: give it enough requests for a window of seconds.
            requests = args.requests * (4 if scheme == "raw+http" else 1)
            for workers in (1,) if quick else (1, 2):
                runs.append(
                    (
                        f"yieldgate burst, {client}, {strategy}, "
                        f"{workers} worker{'s' * (workers > 1)}",
                        workers,
                        burst_command(
                            scheme, server, workers, requests, args.concurrency, strategy
                        ),
                    )
                )
        if args.locust:
            for kind in ("FastHttpUser", "HttpUser"):
                runs.append(
                    (
                        f"locust {kind}, 1 process",
                        1,
                        locust_command(
                            args.locust,
                            f"plain_{kind.lower()}.py",
                            server,
                            args.seconds,
                            args.concurrency,
                        ),
                    )
                )
            # yieldgate's own Locust user (yieldgate.burst.locust), for its overhead.
            for strategy in ("naive", "yieldgate"):
                command = locust_command(
                    args.locust, "strategic.py", server, args.seconds, args.concurrency
                )
                runs.append(
                    (
                        f"locust YieldgateFastHttpUser, {strategy}",
                        1,
                        [*command, f"--yieldgate-strategy={strategy}"],
                    )
                )
        else:
            print("locust: not found (give --locust PATH): no Locust rows")
        for name, processes, command in runs:
            rows.append(measure(name, processes, command, server, cwd))

    base = {r.name: r for r in rows if r.name.startswith("locust")}
    print()
    header = (
        f"{'generator':<48} {'req/s':>8} {'gen cpu':>8} {'req/cpu-s':>10} "
        f"{'server cpu':>10} {'/fast':>6} {'/http':>6}"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        fast = base.get("locust FastHttpUser, 1 process")
        http = base.get("locust HttpUser, 1 process")
        ratio_fast = f"{row.per_core / fast.per_core:.2f}" if fast and fast.per_core else "-"
        ratio_http = f"{row.per_core / http.per_core:.2f}" if http and http.per_core else "-"
        print(
            f"{row.name:<48} {row.rate:>8.0f} {row.cpu:>8.2f} {row.per_core:>10.0f} "
            f"{row.server_cpu:>10.2f} {ratio_fast:>6} {ratio_http:>6}"
        )
    print(
        "\nreq/cpu-s: requests per CPU second of the generator's processes; /fast, /http: "
        "that figure over Locust's (goal: >= 1.5)"
    )
    for client in ("raw HTTP, naive", "raw HTTP, yieldgate", "openai client, naive"):
        one = next((r for r in rows if r.name == f"yieldgate burst, {client}, 1 worker"), None)
        two = next((r for r in rows if r.name == f"yieldgate burst, {client}, 2 workers"), None)
        if one and two and one.rate:
            print(f"2 workers / 1 worker ({client}), req/s: {two.rate / one.rate:.2f}")
    if args.json:
        args.json.write_text(
            json.dumps(
                [
                    {
                        "name": r.name,
                        "processes": r.processes,
                        "rate_per_s": r.rate,
                        "generator_cpu": r.cpu,
                        "per_cpu_s": r.per_core,
                        "server_cpu": r.server_cpu,
                        "requests": r.requests,
                        "status": r.status,
                    }
                    for r in rows
                ],
                indent=1,
            )
            + "\n"
        )
    return 1 if any(r.status != 0 for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
