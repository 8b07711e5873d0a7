"""``Front``: what the HTTP app and its routes need of the front that serves them.

A module of its own, below the app: the app (``_http_app``) builds its routes
from a ``Front``, and the routes (``_http_inference``), their middleware
(``_http_middleware``) and the quota check (``_http_quota``) take one too, while
the app imports them. Kept here, none of them imports the app back.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Protocol

from starlette.types import Receive

from yieldgate.server._http_config import HttpConfig
from yieldgate.server.admission import Admission, Admitted, Failure, Finish, R
from yieldgate.server.backends import Backend, Emit
from yieldgate.server.governor import Governor
from yieldgate.server.quota import ProviderQuota

__all__ = ["Front"]


class Front(Protocol):
    """What the app needs of the front that serves it (``yieldgate.server.http.HttpFront``).

    Described here, not imported: the front imports the app when it starts
    serving, and the app must not import the front back.
    """

    config: HttpConfig
    governor: Governor
    backend: Backend
    admission: Admission
    quota: ProviderQuota | None
    requests: Counter[tuple[str, str]]  # (route, status) -> count
    body_timeouts: int

    def stats(self) -> dict[str, Any]: ...

    def all_connection_stats(self) -> dict[str, int]: ...

    async def run_admitted(
        self, admitted: Admitted, receive: Receive, emit: Emit | None, finish: Finish[R]
    ) -> R | Failure | None: ...
