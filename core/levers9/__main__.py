"""``python -m levers9``: the same as the ``levers9`` command (how providers start workers)."""

from levers9.cli.main import main

main()
