"""Walk an exception's chain: every ``__cause__`` and ``__context__`` link, both ways.

A cycle (an error whose cause's context is that error again) sends a program
that follows the links (a logger, an error reporter, ``while e: e = e.__cause__
or e.__context__``) round forever. Two links to one error (a cause that is
also the context) are not a cycle.
"""

from __future__ import annotations

__all__ = ["assert_acyclic", "chain_of"]


def chain_of(error: BaseException) -> list[BaseException]:
    """Every error reachable from ``error``, each once, ``error`` first.

    Raises ``AssertionError`` naming the loop when a link leads back to an
    error on the way to it.
    """
    reached: list[BaseException] = []
    path: list[BaseException] = []

    def visit(node: BaseException) -> None:
        if any(node is on for on in path):
            loop = [*path[path.index(node) :], node]
            raise AssertionError(
                "exception chain has a cycle: " + " -> ".join(repr(e)[:60] for e in loop)
            )
        if not any(node is seen for seen in reached):
            reached.append(node)
        path.append(node)
        for link in (node.__cause__, node.__context__):
            if link is not None:
                visit(link)
        path.pop()

    visit(error)
    return reached


def assert_acyclic(error: BaseException | None) -> list[BaseException]:
    """``chain_of(error)``: there must be an error, and its chain must hold no cycle."""
    assert error is not None, "no error was raised"
    return chain_of(error)
