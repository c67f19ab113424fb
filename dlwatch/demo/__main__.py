"""``python -m dlwatch.demo``: the demo training job (same flags as ``dlwatch.demo.train``)."""

import sys

from .train import main

if __name__ == "__main__":
    sys.exit(main())
