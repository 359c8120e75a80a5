"""``python -m torch_renaissance ...``: the ``torch-renaissance`` command line."""
import sys

from torch_renaissance.cli import main

if __name__ == "__main__":
    sys.exit(main())
