"""huggingface_hub's process-wide client factories, swapped for a ``huggingface_clients`` block.

huggingface_hub keeps one sync and one async client factory per process, and
one shared sync client (``get_session()``) built by the sync factory. A block
installs its own factories and puts back what it replaced when it exits, so
blocks must nest: one thread's blocks are a stack, and a block entered from
another thread while one is active is refused (``HubClientsInUseError``),
since the two would each put back what the other installed.

The shared client another thread may be using (a download in flight) is never
closed: it is set aside while the block runs and is the shared one again
after it. Only the clients a block's own sync factory made are closed, when
it exits, once huggingface_hub can no longer hand them out. When this
huggingface_hub keeps its factories where they cannot be read, the public
setters are used instead, which close the shared client.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from yieldgate._exceptions import YieldgateError

__all__ = ["HubBlock", "HubClientsInUseError", "enter_block", "exit_block"]

# What huggingface_hub's module holds; all of them, or the public setters are used.
_INTERNALS = (
    "_CLIENT_LOCK",
    "_GLOBAL_CLIENT",
    "_GLOBAL_CLIENT_FACTORY",
    "_GLOBAL_ASYNC_CLIENT_FACTORY",
)


class HubClientsInUseError(YieldgateError, RuntimeError):
    """``huggingface_clients`` was entered while a block of another thread is active.

    huggingface_hub's client factories are process-wide: blocks of two
    threads that overlapped would leave the factories pointing at one
    block's Gate after it exited. Nest blocks in one thread, or enter one
    block around the work of all threads.
    """


@dataclass(frozen=True)
class _Installed:
    """What huggingface_hub hands out: its factories and the shared sync client it cached."""

    async_factory: Any
    sync_factory: Any
    session: Any = None


@dataclass
class HubBlock:
    """One ``huggingface_clients`` block: whose it is and what it replaced."""

    gate: str
    thread_id: int
    thread_name: str
    previous: _Installed
    made: list[Any] = field(default_factory=list)


_blocks: list[HubBlock] = []
_lock = threading.Lock()


def enter_block(
    hub_module: Any,
    hub_http: Any,
    gate: str,
    async_factory: Callable[[], Any],
    sync_factory: Callable[[], Any],
) -> HubBlock:
    """Install the factories of a block for ``gate`` in the calling thread; the block.

    Raises ``HubClientsInUseError`` at once, installing nothing, when a block
    of another thread is active.
    """
    thread = threading.current_thread()
    with _lock:
        for active in _blocks:
            if active.thread_id != thread.ident:
                raise HubClientsInUseError(
                    f"huggingface_clients(gate {active.gate!r}) is active in thread "
                    f"{active.thread_name!r}: huggingface_hub's client factories are "
                    f"process-wide, so a block in thread {thread.name!r} cannot start "
                    f"before it exits; nest blocks in one thread, or enter one block "
                    f"around the work of all threads"
                )
        made: list[Any] = []

        def sync_factory_of_block() -> Any:
            client = sync_factory()
            made.append(client)
            return client

        previous = _swap(hub_module, hub_http, _Installed(async_factory, sync_factory_of_block))
        block = HubBlock(gate, thread.ident or 0, thread.name, previous, made)
        _blocks.append(block)
    return block


def exit_block(hub_module: Any, hub_http: Any, block: HubBlock) -> None:
    """Put back what ``block`` replaced, then close the clients it made."""
    with _lock:
        index = next(i for i, active in enumerate(_blocks) if active is block)
        del _blocks[index]
        if index == len(_blocks):
            _swap(hub_module, hub_http, block.previous)
        else:
            # Exited before a block entered after it (two tasks of one thread):
            # that one's factories stay, and it puts back what this one replaced.
            _blocks[index].previous = block.previous
    for client in block.made:
        client.close()


def _swap(hub_module: Any, hub_http: Any, installing: _Installed) -> _Installed:
    """Install ``installing``; what was installed before."""
    if not all(hasattr(hub_http, name) for name in _INTERNALS):
        previous_async, previous_sync = _hub_factories(hub_http)
        hub_module.set_async_client_factory(installing.async_factory)
        # The only public way: it closes the shared client, whoever is using it.
        hub_module.set_client_factory(installing.sync_factory)
        return _Installed(previous_async, previous_sync)
    session = installing.session
    if session is not None and getattr(session, "is_closed", False):
        session = None  # closed by its holder meanwhile: the factory makes another
    with hub_http._CLIENT_LOCK:
        previous = _Installed(
            hub_http._GLOBAL_ASYNC_CLIENT_FACTORY,
            hub_http._GLOBAL_CLIENT_FACTORY,
            hub_http._GLOBAL_CLIENT,
        )
        hub_http._GLOBAL_ASYNC_CLIENT_FACTORY = installing.async_factory
        hub_http._GLOBAL_CLIENT_FACTORY = installing.sync_factory
        # Set aside, not closed: other threads may be using it.
        hub_http._GLOBAL_CLIENT = session
    return previous


def _hub_factories(hub_http: Any) -> tuple[Any, Any]:
    """The factories huggingface_hub uses now (async, sync).

    huggingface_hub has setters but no getters: the factories are read from
    the module that holds them, and taken to be its defaults if it moved them.
    """
    default_async = getattr(hub_http, "default_async_client_factory", None)
    default_sync = getattr(hub_http, "default_client_factory", None)
    current_async = getattr(hub_http, "_GLOBAL_ASYNC_CLIENT_FACTORY", default_async)
    current_sync = getattr(hub_http, "_GLOBAL_CLIENT_FACTORY", default_sync)
    if current_async is None or current_sync is None:
        raise RuntimeError("this huggingface_hub keeps its client factories where yieldgate can't")
    return current_async, current_sync
