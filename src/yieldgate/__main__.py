"""``python -m yieldgate``: the same as the ``yieldgate`` command."""

import sys

from yieldgate.cli import main

if __name__ == "__main__":
    sys.exit(main())
