"""A burst test in Python: the same burst through yieldgate and through a naive client.

``yieldgate.burst`` (the ``burst`` extra) is what ``yieldgate burst`` runs:
it fires an arrival profile at a target, once per strategy, and reports
success, attempts per request, yields, makespan and latency. ``naive`` makes
one attempt per request, so every refusal is a failure; ``yieldgate`` sends
through a Gate. Against a running server (8 slots, 50x more requests):

    yieldgate serve --port 7070 --max-inflight 8 --exec-ms 50 &
    python examples/burst_test.py --target tcp://127.0.0.1:7070 --requests 400

Both strategies then meet that same server one after the other. With
``--serve "ARGS"`` the tool starts a fresh ``yieldgate serve ARGS`` for each
strategy instead (give the target as a bare scheme, or leave the default):

    python examples/burst_test.py --serve "--max-inflight 8 --exec-ms 50"

Targets: ``tcp://HOST:PORT`` (GovernedClient), ``openai+http://``,
``hf+http://`` (the official clients) and ``tgi+http://`` (plain httpx).
``--json PATH`` writes the full report (docs/burst.md has its schema).
Exits non-zero when yieldgate misses its goal: every request served, at most
2 attempts per request.
"""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

from yieldgate.burst import ArrivalProfile, BurstConfig, Goal, Strategy, run_burst, summary_line


def main(target: str, requests: int, serve: str | None, json_path: Path | None) -> int:
    config = BurstConfig(
        target=target,
        requests=requests,
        profile=ArrivalProfile.all_at_once(),
        strategies=(Strategy(name="yieldgate"), Strategy(name="naive")),
        serve_args=None if serve is None else tuple(shlex.split(serve)),
        goal=Goal(min_success_rate=1.0, max_attempts_per_request=2.0),
    )
    where = f"a fresh `yieldgate serve {serve}` each" if serve is not None else target
    print(f"{requests} requests at once -> {where}")
    report = run_burst(config)
    for r in report.results:
        p95 = r.latency_s.p95
        print(
            f"  {r.label:<10} success {r.success_rate:6.1%}  "
            f"attempts/request {r.attempts_per_request:5.2f}  yields {r.yields:5d}  "
            f"makespan {r.makespan_s:6.2f} s  p95 latency "
            + ("-" if p95 is None else f"{p95:.2f} s")
        )
        if r.errors_by_kind:
            print(f"  {'':<10} failed: {dict(r.errors_by_kind)}")
    print(summary_line(report))
    if json_path is not None:
        json_path.write_text(json.dumps(report.as_dict(), indent=1) + "\n", encoding="utf-8")
        print(f"report written to {json_path}")
    return 0 if all(met for _, met, _ in report.verdicts()) else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="tcp://127.0.0.1:7070", help="where to send")
    parser.add_argument("--requests", type=int, default=400, help="requests, all at once")
    parser.add_argument("--serve", metavar="ARGS", help="start `yieldgate serve ARGS` per strategy")
    parser.add_argument("--json", type=Path, help="also write the report as JSON here")
    args = parser.parse_args()
    target = "tcp://" if args.serve and args.target == parser.get_default("target") else args.target
    raise SystemExit(main(target, args.requests, args.serve, args.json))
