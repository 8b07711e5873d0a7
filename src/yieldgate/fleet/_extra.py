"""Imported first by ``yieldgate.fleet``: without redis-py, a ``MissingExtraError``
that names the ``fleet`` extra, not a ``ModuleNotFoundError`` from deep inside."""

from yieldgate._extras import require

require("redis", "yieldgate.fleet (a Gate's shared=)")
