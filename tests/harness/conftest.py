"""Harness tests need torch (the ``harness`` extra) and run it on one thread."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
torch.set_num_threads(1)
