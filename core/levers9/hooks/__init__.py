"""The plugin contract: everything a provider, runtime or discovery plugin and the core agree on.

- :mod:`~levers9.hooks.markers`: ``hookimpl``/``hookspec`` and the entry-point group;
- :mod:`~levers9.hooks.spec`: the hook specification, the one list of hooks;
- :mod:`~levers9.hooks.types`: the frozen, typed models hooks take and return;
- :mod:`~levers9.hooks.errors`: the typed errors, each naming the plugin and hook;
- :mod:`~levers9.hooks.manager`: loading plugins, isolating broken ones, allow and block lists;
- :mod:`~levers9.hooks.facade`: typed async calls with deadlines and result checks.
"""

from levers9.hooks.markers import hookimpl, hookspec

__all__ = ["hookimpl", "hookspec"]
