"""``python -m horovod.runner``: the same as ``horovodrun``."""

import sys

from horovod.runner.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
