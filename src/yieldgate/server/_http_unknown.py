"""What the HTTP app tells a request that no route takes: an unknown path (404), a
method its path does not take (405).

The answer is in the shape of the API family the request was meant for, so that
the family's official client shows its message (openai's shows only ``Error code:
404`` for a body without ``error.message``). That family is the one of the route
the request would have reached with its base URL fixed: ``/v1`` added (an OpenAI
client whose base URL lacks it), a prefix dropped (an Anthropic client whose base
URL ends in ``/v1``, which it adds itself), or both. Failing that, a 405's is its
path's route's, and a 404's the path's own (``path_family``). The message names
the route meant and what is probably wrong with the base URL, as OpenAI's "Invalid
URL (GET /foo)" does not.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from starlette.routing import Route

from yieldgate.server._http_responses import Family, path_family

__all__ = ["RouteTable", "Unknown"]

_V1 = "/v1"
# The most path segments a hint drops from the front ("/v1/v1/messages": one).
_MAX_DROPPED = 2


@dataclass(frozen=True, slots=True)
class Unknown:
    """What a request no route takes is answered: the family whose shape, the message."""

    family: Family
    message: str


@dataclass(frozen=True, slots=True)
class _Hint:
    route: Route
    family: Family
    path: str  # the path the request probably meant
    dropped: str  # the prefix too many in the base URL, if any
    added_v1: bool  # whether the base URL lacks /v1


class RouteTable:
    """The app's routes, each with its family, to answer what none of them takes."""

    def __init__(self, routes: Sequence[tuple[Route, Family]]) -> None:
        self._routes = tuple(routes)
        self._families = {route.path_format: family for route, family in routes}
        listed = dict.fromkeys(route.path_format for route, _ in routes)
        self._listing = ", ".join(listed)

    def family_of(self, route_path: str | None, path: str) -> Family:
        """The family of the route ``route_path`` (starlette's ``path_format``), else of
        ``path`` alone."""
        if route_path is not None and route_path in self._families:
            return self._families[route_path]
        return path_family(path)

    def unknown(self, method: str, path: str, status: int) -> Unknown:
        """The answer to ``method path``: a 404 (no route has the path) or a 405."""
        hint = self._hint(method, path, same_method_only=status == 405)
        if status == 405:
            served = self._route_of(path)
            allowed = _methods(served) if served is not None else "another method"
            message = f"Method not allowed ({method} {path}): {path} takes {allowed}"
            family = served[1] if served is not None else path_family(path)
        else:
            message = f"Invalid URL ({method} {path}): no route has this path"
            family = path_family(path)
        if hint is None:
            if status != 405:
                message += f"; the routes are {self._listing}"
            return Unknown(family, message)
        methods = method if status == 405 else _methods((hint.route, hint.family))
        return Unknown(hint.family, f"{message}. Did you mean {methods} {hint.path}? {_why(hint)}")

    def _route_of(self, path: str) -> tuple[Route, Family] | None:
        for route, family in self._routes:
            if route.path_regex.match(path):
                return route, family
        return None

    def _hint(self, method: str, path: str, *, same_method_only: bool) -> _Hint | None:
        """The route ``path`` probably meant, one taking ``method`` first."""
        other_method: _Hint | None = None
        for candidate, dropped, added_v1 in _candidates(path):
            if candidate == path:
                continue
            for route, family in self._routes:
                if not route.path_regex.match(candidate):
                    continue
                hint = _Hint(route, family, candidate, dropped, added_v1)
                if route.methods is None or method in route.methods:
                    return hint
                if other_method is None and not same_method_only:
                    other_method = hint
        return other_method


def _candidates(path: str) -> Iterator[tuple[str, str, bool]]:
    """The paths ``path`` may have meant, the likeliest first: ``(path, prefix dropped,
    /v1 added)``, the prefix at most ``_MAX_DROPPED`` segments. Never TGI's ``/``."""
    if len(path) > 1 and path.endswith("/"):
        path = path.rstrip("/")
        yield path, "", False  # a trailing slash too many (starlette redirects none here)
    segments = path.split("/")[1:]
    for n in range(min(len(segments), _MAX_DROPPED + 1)):
        rest = "/" + "/".join(segments[n:])
        if rest == "/":
            return
        dropped = "/" + "/".join(segments[:n]) if n else ""
        if n:
            yield rest, dropped, False
        if rest != _V1 and not rest.startswith(_V1 + "/"):
            yield _V1 + rest, dropped, True


def _methods(served: tuple[Route, Family]) -> str:
    methods = served[0].methods or set()
    return "/".join(sorted(methods - {"HEAD"})) or "no method"


def _why(hint: _Hint) -> str:
    if hint.added_v1 and hint.dropped:
        return f"The base URL probably has '{hint.dropped}' where '{_V1}' belongs."
    if hint.added_v1:
        if hint.family == "openai":
            return f"The base URL probably lacks '{_V1}' (an OpenAI client's ends in '{_V1}')."
        return f"The base URL probably lacks '{_V1}'."
    if not hint.dropped:
        return "The path has a trailing '/' too many."
    why = f"The base URL probably has '{hint.dropped}' too many"
    if hint.family == "anthropic" and hint.dropped.endswith(_V1):
        return f"{why} (the anthropic client adds '{_V1}' itself)."
    return f"{why}."
