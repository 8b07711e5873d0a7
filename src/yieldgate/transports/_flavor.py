"""Which HTTP library a gated client is built on: httpx or httpx2.

The two are separate packages with the same API and separate types: a client
of one cannot take a transport of the other, and the official clients accept
only theirs (openai 2.x and huggingface_hub 1.x are built on httpx, openai
3.x and huggingface_hub 2.x on httpx2). The flavor is read, in this order,
from the inner transport a caller passed, from the installed openai, then
huggingface_hub (the requirements each distribution declares: nothing is
imported), and last from which of httpx2 and httpx is installed.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import re
import sys
from typing import Any, Literal, get_args

from yieldgate._extras import MissingExtraError

__all__ = ["Flavor", "detect_flavor", "flavor_of_distribution", "library"]

Flavor = Literal["httpx", "httpx2"]
"""Which HTTP library a transport is built for: ``httpx``, or ``httpx2`` (openai 3.x's)."""
# Preferred first: the library the official clients now build on.
_FLAVORS: tuple[Flavor, ...] = ("httpx2", "httpx")
# The clients whose library decides a flavor no one named, in this order.
_CLIENTS = ("openai", "huggingface_hub")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def library(flavor: str) -> Any:
    """The ``httpx`` or ``httpx2`` module; a clear error for anything else."""
    if flavor not in get_args(Flavor):
        raise ValueError(f"flavor must be 'httpx' or 'httpx2', got {flavor!r}")
    try:
        return importlib.import_module(flavor)
    except ImportError:
        if flavor == "httpx2":
            raise MissingExtraError("flavor='httpx2'", "httpx2") from None
        raise ImportError(f"flavor={flavor!r} needs the httpx package: pip install httpx") from None


def _installed(flavor: Flavor) -> bool:
    return flavor in sys.modules or importlib.util.find_spec(flavor) is not None


@functools.cache
def flavor_of_distribution(name: str) -> Flavor | None:
    """The HTTP library the installed distribution ``name`` requires, or ``None``.

    Read from its metadata (``Requires-Dist``), so the client is not imported;
    requirements behind an extra do not count. ``None`` when the distribution
    is not installed or requires neither library.
    """
    from importlib import metadata  # 20-50 ms: only when a flavor must be detected

    try:
        requirements = metadata.requires(name) or []
    except metadata.PackageNotFoundError:
        return None
    required = set()
    for requirement in requirements:
        spec, _, marker = requirement.partition(";")
        found = _NAME.match(spec.strip())
        if found is not None and "extra" not in marker:
            required.add(found.group().lower().replace("_", "-"))
    return next((flavor for flavor in _FLAVORS if flavor in required), None)


def flavor_of_transport(transport: Any) -> tuple[Flavor, frozenset[bool]] | None:
    """The library ``transport`` is a transport of, and its kinds (``True``: sync).

    A ``MockTransport`` is both kinds.
    """
    for flavor in _FLAVORS:
        module = sys.modules.get(flavor)
        if module is None:
            continue
        kinds = frozenset(
            sync
            for sync, base in ((True, module.BaseTransport), (False, module.AsyncBaseTransport))
            if isinstance(transport, base)
        )
        if kinds:
            return flavor, kinds
    return None


def detect_flavor(*, inner: Any = None, client: str | None = None) -> Flavor:
    """The flavor for a gated client nobody named one for.

    ``inner`` (a transport the caller passed) decides if it is one of the two
    libraries'; then the library ``client`` requires (the distribution the
    gated client is for), or if none is given, the installed openai's, else
    huggingface_hub's; then httpx2 if it is installed, else httpx.
    """
    if inner is not None:
        found = flavor_of_transport(inner)
        if found is not None:
            return found[0]
    for name in (client,) if client is not None else _CLIENTS:
        flavor = flavor_of_distribution(name)
        if flavor is not None and _installed(flavor):
            return flavor
    return "httpx2" if _installed("httpx2") else "httpx"
