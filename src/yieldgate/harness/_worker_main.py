"""``python -m yieldgate.harness._worker_main``: a prefill worker process's entry point.

Kept apart from ``prefill_worker`` so that running it does not re-import a
module the package has already loaded.
"""

import sys

from yieldgate.harness.prefill_worker import main

if __name__ == "__main__":
    sys.exit(main())
