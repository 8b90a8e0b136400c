"""``python -m levers9.runner``: the runner inside every container (see :mod:`levers9.runner.main`)."""

import sys

from levers9.runner.main import main

if __name__ == "__main__":
    sys.exit(main())
