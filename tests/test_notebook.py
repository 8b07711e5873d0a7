"""Issue 41: a notebook, executed in a real IPython kernel (nbclient), as users write one.

Its cells run on the kernel's event loop: a sync gated client, the async one awaited
at top level, a stream read in full and one left after its first chunk, and the sync
client again. Each call goes to a real reference server; the Gate holds nothing at
the end, and the one warning a notebook's sync call gives appears once.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator

import pytest

from yieldgate.server import ServerProcess, spawn

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

CELLS = [
    """
import yieldgate

gate = yieldgate.Gate(name="notebook")
chat = yieldgate.openai_client(gate, sync=True, base_url=BASE_URL, api_key="x")
reply = chat.chat.completions.create(
    model="tiny", messages=[{"role": "user", "content": "sync one"}]
)
print("sync:", reply.choices[0].message.content)
""",
    """
achat = yieldgate.openai_client(gate, base_url=BASE_URL, api_key="x")
reply = await achat.chat.completions.create(
    model="tiny", messages=[{"role": "user", "content": "async"}]
)
print("async:", reply.choices[0].message.content)
""",
    """
stream = await achat.chat.completions.create(
    model="tiny", messages=[{"role": "user", "content": "a stream"}], stream=True
)
parts = [c.choices[0].delta.content or "" async for c in stream if c.choices]
print("streamed:", len(parts))
""",
    """
for chunk in chat.chat.completions.create(
    model="tiny", messages=[{"role": "user", "content": "left"}], stream=True
):
    break  # the stream is left after one chunk, as a user stops reading
del chunk
""",
    """
import gc

gc.collect()
reply = chat.chat.completions.create(
    model="tiny", messages=[{"role": "user", "content": "sync two"}]
)
print("sync again:", reply.choices[0].message.content)
stats = gate.statistics()
print("STATS", {"inflight": stats.window.inflight, "calls_ok": stats.calls_ok,
                "calls_failed": stats.calls_failed})
""",
]


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with spawn("--exec-ms", "5", http=True) as proc:
        yield proc


def test_a_notebook_runs_sync_async_and_streaming_calls_in_a_real_kernel(
    server: ServerProcess,
) -> None:
    notebook = nbformat.v4.new_notebook()
    setup = f"BASE_URL = {server.http_url + '/v1'!r}"
    notebook.cells = [nbformat.v4.new_code_cell(setup)] + [
        nbformat.v4.new_code_cell(cell.strip()) for cell in CELLS
    ]
    client = nbclient.NotebookClient(notebook, timeout=120, kernel_name="python3")
    client.km = client.create_kernel_manager()
    # the kernel is this interpreter (the venv's), whatever kernels the machine has
    client.km.kernel_spec.argv[0] = sys.executable
    client.execute()  # raises CellExecutionError, with the cell's traceback, on an error
    streams = [
        (index, output.get("name"), output.get("text", ""))
        for index, cell in enumerate(notebook.cells)
        for output in cell.get("outputs", [])
        if output.get("output_type") == "stream"
    ]
    stdout = "".join(text for _, name, text in streams if name == "stdout")
    stderr = "".join(text for _, name, text in streams if name == "stderr")
    for label in ("sync:", "async:", "streamed:", "sync again:"):
        assert label in stdout, stdout
    assert stderr.count("notebook cell blocks the kernel's event loop") == 1, stderr
    stats = json.loads(stdout.split("STATS ", 1)[1].strip().replace("'", '"'))
    assert stats == {"inflight": 0, "calls_ok": 5, "calls_failed": 0}, stats
