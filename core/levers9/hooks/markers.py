"""The pluggy markers for levers9 hooks.

Kept in a module of their own, with nothing heavy imported, so a plugin can do
``from levers9 import hookimpl`` without pulling in the rest of the core.
"""

from __future__ import annotations

import pluggy

PROJECT = "levers9"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)
