"""Benchmark: the seed's cold start (seed 001), through every client strategy.

A fresh ``yieldgate serve --cold-start-s 2 --ramp-s 5 --max-inflight 8
--exec-ms 500 --http-port 0`` per strategy: for 2 s the HuggingFace route
answers 503 "currently loading" with ``estimated_time`` (the Inference API's
cold start), then capacity ramps from 1 slot to 8 over 5 s. 100 requests
arrive at once, through ``huggingface_hub.AsyncInferenceClient``. This is
``yieldgate burst --preset cold-start``.

Strategies: ``yieldgate`` with the default policy; ``yieldgate`` with
``GatePolicy.cold_start()`` plus a rate cap ramping 1 -> 20 starts/s over 5 s
(``COLD_START_RAMP``); then ``naive``, ``tenacity`` and ``openai-default``.
Goal for yieldgate: 100% success with at most 1.5 attempts per request.
The lower bound on the makespan counts the cold start and the ramp.

Run it (from the repository root)::

    .venv/bin/python bench/burst_cold_start.py
    .venv/bin/python bench/burst_cold_start.py --requests 200 --json cold.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from _common import add_smoke_flag, smoke
from yieldgate.burst import PRESETS, BurstConfig, markdown_table, run_burst, summary_line


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the full report here")
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    if smoke(args):
        args.requests = 8

    settings = {**PRESETS["cold-start"], "requests": args.requests, "seed": args.seed}
    if smoke(args):  # a short cold start and ramp, short requests
        settings["serve_args"] = (
            *("--cold-start-s", "0.3", "--ramp-s", "0.5"),
            *("--max-inflight", "8", "--exec-ms", "20"),
        )
    report = run_burst(BurstConfig(**settings))
    serve = " ".join(settings["serve_args"])
    print(
        f"{args.requests} requests at once through huggingface_hub -> `yieldgate serve {serve}` "
        f"(fresh per strategy); {os.cpu_count()} CPUs"
    )
    print()
    print(markdown_table(report))
    print()
    print(summary_line(report))
    if args.json is not None:
        args.json.write_text(json.dumps(report.as_dict(), indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
