"""The HTTP app's first stop: inference requests straight to their route.

A saturated server answers most requests with a 429 at once, so the path to
an inference route is kept short: ``InferenceRouter`` hands a ``POST`` that
one of them matches straight to its ``Inference`` (which checks the secret
and counts the request itself), and everything else to the starlette app
behind it: the other routes, the 405 of another method on an inference
path, the 404 of an unknown path, each counted by ``Counted``.

It matches as starlette's router does, with the same ``Route`` objects (the
first inference route whose path and method match), so the starlette app
never sees a request an inference route takes. A path with no parameters is
looked up first (with no ``root_path``), which is the same match without
running the regexes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from starlette.routing import Match, Route
from starlette.types import ASGIApp, Receive, Scope, Send

if TYPE_CHECKING:
    from yieldgate.server._http_inference import Inference

__all__ = ["InferenceRouter"]


class InferenceRouter:
    """An ASGI app: each ``(route, inference)`` pair's requests to ``inference``,
    in order, and the rest to ``app``.

    Every route must take ``POST`` only; ``app`` must route the same paths
    (for their other methods).
    """

    def __init__(self, routes: Sequence[tuple[Route, Inference]], app: ASGIApp) -> None:
        for route, _ in routes:
            if route.methods != {"POST"}:
                raise ValueError(f"an inference route takes POST only: {route.path}")
        self.app = app
        self._routes = tuple(routes)
        # Paths without parameters that no route before matches: their route, by path.
        self._exact: dict[str, Inference] = {}
        for i, (route, inference) in enumerate(self._routes):
            earlier = self._routes[:i]
            if not route.param_convertors and not any(
                r.path_regex.match(route.path) for r, _ in earlier
            ):
                self._exact[route.path] = inference

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            if not scope.get("root_path"):
                inference = self._exact.get(scope["path"])
                if inference is not None:
                    await inference(scope, receive, send)
                    return
            for route, inference in self._routes:
                match, child = route.matches(scope)
                if match is Match.FULL:
                    scope.update(child)  # as starlette's router: the path parameters
                    await inference(scope, receive, send)
                    return
        await self.app(scope, receive, send)
