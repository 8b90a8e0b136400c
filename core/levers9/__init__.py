"""levers9: an open control plane that runs containers on any compute.

This module stays light on purpose: ``levers9 --help`` and every plugin import
it, so it must not pull in the SDK's, the server's or any provider's
dependencies. Plugins use ``from levers9 import hookimpl``.
"""

from levers9.__about__ import __version__
from levers9.hooks.markers import hookimpl

__all__ = ["__version__", "hookimpl"]
