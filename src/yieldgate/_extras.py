"""The optional parts of yieldgate: which extra brings each module, and the error
when one is missing.

``require(module, what)`` imports ``module`` or raises ``MissingExtraError``,
whose message names the extra and the line that installs it, e.g.
``yieldgate serve --http-port needs the 'server' extra (no module named
'starlette'): pip install 'yieldgate[server]'``. It is an ``ImportError``, so
code that already catches ``ImportError`` still does.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["EXTRAS", "MissingExtraError", "install_line", "require"]

# The modules each extra brings (pyproject.toml's optional dependencies), by import name.
EXTRAS: dict[str, tuple[str, ...]] = {
    "server": ("starlette", "uvicorn", "msgspec", "httptools", "prometheus_client", "uvloop"),
    "harness": ("torch", "numpy"),
    "burst": ("rich", "matplotlib"),
    "fleet": ("redis",),
    "httpx2": ("httpx2",),
}
_EXTRA_OF = {module: extra for extra, modules in EXTRAS.items() for module in modules}


def install_line(extra: str) -> str:
    """The shell line that installs ``extra``; torch's CPU wheel first for the harness
    (a plain ``pip install torch`` may fetch a multi-GB CUDA build)."""
    line = f"pip install 'yieldgate[{extra}]'"
    if extra == "harness":
        return f"pip install torch --index-url https://download.pytorch.org/whl/cpu, then {line}"
    return line


class MissingExtraError(ImportError):
    """An optional dependency is not installed. ``extra`` names the extra that brings
    it (``None`` for a module no extra brings), ``name`` the missing module."""

    def __init__(self, what: str, module: str, extra: str | None = None) -> None:
        extra = extra or _EXTRA_OF.get(module.partition(".")[0])
        if extra is None:
            message = f"{what} needs the {module} package (no module named {module!r})"
        else:
            message = (
                f"{what} needs the {extra!r} extra (no module named {module!r}): "
                f"{install_line(extra)}"
            )
        super().__init__(message, name=module)
        self.extra = extra
        """The extra that brings the module (``"server"``, ``"fleet"``...); ``None``: none does."""
        self.what = what
        """What needed it, in words (``"yieldgate.server's HTTP front"``)."""


def require(module: str, what: str) -> ModuleType:
    """``import module``, or ``MissingExtraError`` saying that ``what`` needs its extra.

    A module that is installed but fails to import because one of its own dependencies
    is missing names that dependency, under ``module``'s extra. Any other ``ImportError``
    (an installed module that is broken or of the wrong version) goes up as it is: no
    extra would mend it.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:  # not an ImportError of an installed module's own
        missing = exc.name or module
        extra = _EXTRA_OF.get(missing.partition(".")[0]) or _EXTRA_OF.get(module.partition(".")[0])
        raise MissingExtraError(what, missing, extra) from exc
