"""Model names metered as one quota: a scope's aliases.

OpenAI answers ``gpt-4o`` as ``gpt-4o-2024-08-06`` and meters both names as one
quota; a Gate that keeps the quota per model (``QuotaPolicy.per_model``) would keep
two scopes, each paced as if it had the whole quota. An answer's ``model`` field
settles it (``learn``): a dated snapshot of the model requested is metered as the
requested model from then on. ``QuotaPolicy.aliases`` names what no answer says
(Azure deployments that share one quota). Read and written under the Gate's lock.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from yieldgate.gate._cost import Cost

__all__ = ["MAX_ALIASES", "Aliases"]

# Learnt aliases kept per Gate at most (answers naming a new snapshot each time must
# not grow them without bound).
MAX_ALIASES = 256
# A snapshot's version after its model's name: a date (2024-08-06, 20250929) or a
# number (0613, 2411).
_VERSION = re.compile(r"\d{2,8}(?:-\d{2}){0,2}")


class Aliases(dict[str, str]):
    """Name -> the scope it is metered as: the caller's, then those learnt."""

    def __init__(self, given: Mapping[str, str] | Iterable[tuple[str, str]] = ()) -> None:
        super().__init__(given)

    def scoped(self, cost: Cost) -> Cost:
        """``cost`` in the scope its model is metered as."""
        scope = self.get(cost.scope)
        return cost if scope is None or scope == cost.scope else cost._replace(scope=scope)

    def learn(self, requested: str, answered: str) -> None:
        """An answer to a request of scope ``requested`` names ``answered``: a dated
        snapshot of it (``gpt-4o-2024-08-06`` of ``gpt-4o``, ``claude-sonnet-4-5-20250929``
        of ``claude-sonnet-4-5``, ``mistral-large-2411`` of ``mistral-large-latest``) is
        metered as ``requested`` from now on. Anything else (another model of the same
        family, an Azure deployment's model, a router's choice) is not."""
        if answered in self or len(self) >= MAX_ALIASES:
            return
        base = requested.removesuffix("-latest")
        version = answered.removeprefix(f"{base}-")
        if base and version != answered and _VERSION.fullmatch(version):
            self[answered] = requested
