"""The operator's config: one YAML file, validated with line numbers, then against the plugins."""

from levers9.config.load import ConfigError, ConfigIssue, LoadedConfig, default_config_path, load_config
from levers9.config.model import Config, PoolConfig

__all__ = ["Config", "ConfigError", "ConfigIssue", "LoadedConfig", "PoolConfig", "default_config_path", "load_config"]
