"""Imported first by ``yieldgate.harness``: without torch, a ``MissingExtraError``
that names the ``harness`` extra, not a ``ModuleNotFoundError`` from deep inside."""

from yieldgate._extras import require

require("torch", "yieldgate.harness")
