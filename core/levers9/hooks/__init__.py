"""The plugin contract: markers, the hook spec, typed data, errors, the manager and the typed facade."""

from levers9.hooks.markers import hookimpl, hookspec

__all__ = ["hookimpl", "hookspec"]
