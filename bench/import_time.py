"""What ``import yieldgate`` costs, with every extra installed, beside what users import anyway.

Each round runs, in fresh interpreters and interleaved, ``python -X importtime -c
"import M"`` for yieldgate and for the peers a user of it imports in the same program
(openai, huggingface_hub, httpx, tenacity), and reads the cumulative microseconds of the
top-level import. Bytecode is written and warm (a first, discarded run), as after
``pip install``, which compiles it. Prints the median and spread per module, the ratio
to ``import openai`` (the client a Gate is most often put under) and the modules of
the extras that ``import yieldgate`` loaded (there must be none).

    .venv/bin/python bench/import_time.py [--rounds 15]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys

from _common import add_smoke_flag, smoke

MODULES = ["yieldgate", "openai", "huggingface_hub", "httpx", "tenacity"]
HEAVY = ["redis", "opentelemetry.sdk", "torch", "starlette", "uvicorn", "rich", "matplotlib"]
LINE = re.compile(r"import time:\s+\d+ \|\s+(\d+) \| (\S+)$")


def import_us(module: str, env: dict[str, str]) -> int:
    """The cumulative import time of ``module`` in a fresh interpreter, in microseconds."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", f"import {module}"],
        capture_output=True, text=True, check=True, env=env,
    )  # fmt: skip
    for line in result.stderr.splitlines():
        found = LINE.match(line)
        if found and found.group(2) == module:
            return int(found.group(1))
    raise RuntimeError(f"no import time for {module}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    add_smoke_flag(parser)
    args = parser.parse_args()
    if smoke(args):
        args.rounds = 1
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    for module in MODULES:  # writes the bytecode: a pip install compiles it too
        import_us(module, env)
    samples: dict[str, list[int]] = {m: [] for m in MODULES}
    for _ in range(args.rounds):
        for module in MODULES:
            samples[module].append(import_us(module, env))
    loaded = subprocess.run(
        [sys.executable, "-c", f"import sys, yieldgate; print([m for m in {HEAVY!r} "
         "if m in sys.modules])"],
        capture_output=True, text=True, check=True, env=env,
    ).stdout.strip()  # fmt: skip
    openai = statistics.median(samples["openai"])
    print(f"python {sys.version.split()[0]}, {args.rounds} interleaved rounds, -X importtime")
    print(f"{'module':<16} {'median ms':>9} {'min':>6} {'max':>6} {'x openai':>8}")
    for module, values in samples.items():
        median = statistics.median(values)
        print(
            f"{module:<16} {median / 1e3:9.1f} {min(values) / 1e3:6.1f} "
            f"{max(values) / 1e3:6.1f} {median / openai:8.2f}"
        )
    print(f"extras' modules loaded by import yieldgate: {loaded}")


if __name__ == "__main__":
    main()
