"""``python -m yieldgate``: the same as the ``yieldgate`` command."""

import sys

from yieldgate.cli import main

sys.exit(main())
