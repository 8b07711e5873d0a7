"""yieldgate: client-side backpressure for inference endpoints.

A backend that buffers a burst hides its overload; clients that retry in
lockstep amplify it. yieldgate's governed server refuses to queue and answers
``yield`` with an honest retry hint; the SDK treats a yield as a congestion
signal, not a failure.

The public surface is what ``__all__`` lists; everything in a ``_module`` is
private. The wire protocol lives in ``yieldgate.protocol`` and the reference
server in ``yieldgate.server``; importing ``yieldgate`` never imports the
extras (torch, starlette, uvicorn, rich).
"""

from importlib import metadata as _metadata

from yieldgate._exceptions import FrameError, ProtocolError, YieldgateError

try:
    __version__ = _metadata.version("yieldgate")
except _metadata.PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0"

__all__ = [
    "FrameError",
    "ProtocolError",
    "YieldgateError",
    "__version__",
]
