"""The operator's config: one YAML file, validated with line numbers, then against the plugins.

Names are resolved lazily: plugins import :mod:`levers9.config.fields` for their
settings models, and that must not drag the loader, YAML and the plugin
manager into every plugin import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from levers9.config.load import ConfigError, ConfigIssue, LoadedConfig, default_config_path, load_config
    from levers9.config.model import Config, PoolConfig

_WHERE = {
    "Config": "levers9.config.model",
    "PoolConfig": "levers9.config.model",
    "ConfigError": "levers9.config.load",
    "ConfigIssue": "levers9.config.load",
    "LoadedConfig": "levers9.config.load",
    "default_config_path": "levers9.config.load",
    "load_config": "levers9.config.load",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'levers9.config' has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)


__all__ = ["Config", "ConfigError", "ConfigIssue", "LoadedConfig", "PoolConfig", "default_config_path", "load_config"]
