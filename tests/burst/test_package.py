"""``yieldgate.burst`` stays light until it runs: the extras load when used."""

from __future__ import annotations

import subprocess
import sys


def test_importing_burst_loads_no_extra_and_no_server() -> None:
    code = (
        "import sys, yieldgate.burst; "
        "heavy = {'rich', 'matplotlib', 'openai', 'huggingface_hub', 'torch', "
        "'yieldgate.server', 'yieldgate.harness', 'locust', 'gevent', "
        "'yieldgate.burst.locust', 'yieldgate.burst._workers', 'multiprocessing'}; "
        "print(sorted(heavy & set(sys.modules)))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"
