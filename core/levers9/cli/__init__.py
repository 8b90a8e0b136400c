"""The ``levers9`` command line."""
