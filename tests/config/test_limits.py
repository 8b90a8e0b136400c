"""``limits:``: the operator's caps on payloads and on the output kept per task, written as sizes."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from levers9.config.load import ConfigError, load_config
from levers9.hooks.manager import PluginPolicy, load_plugins


def _load(tmp_path: Path, text: str) -> object:
    path = tmp_path / "levers9.yaml"
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    loaded = load_config(path, plugins=load_plugins(PluginPolicy()))
    loaded.hooks.close()
    return loaded.config


def _issues(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, text)
    return [str(issue) for issue in info.value.issues]


def test_defaults_are_one_gib_and_eight_mib(tmp_path: Path) -> None:
    config = _load(tmp_path, "version: 1\n")
    assert config.limits.max_payload_bytes == 1024**3  # type: ignore[attr-defined]
    assert config.limits.max_task_log_bytes == 8 * 1024**2  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("payload", "log", "payload_bytes", "log_bytes"),
    [
        ("512MiB", "256KiB", 512 * 1024**2, 256 * 1024),
        ("1GiB", "64Ki", 1024**3, 64 * 1024),
        ("8GB", "1MiB", 8 * 1024**3, 1024**2),
        ("1048576", "65536", 1024**2, 64 * 1024),
        (2 * 1024**2, "16M", 2 * 1024**2, 16 * 1024**2),
    ],
)
def test_sizes_are_read_in_binary_units(
    tmp_path: Path, payload: object, log: object, payload_bytes: int, log_bytes: int
) -> None:
    config = _load(tmp_path, f"limits:\n  max_payload_bytes: {payload}\n  max_task_log_bytes: {log}\n")
    assert config.limits.max_payload_bytes == payload_bytes  # type: ignore[attr-defined]
    assert config.limits.max_task_log_bytes == log_bytes  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("max_payload_bytes: 9GiB", "limits.max_payload_bytes: 9 GiB is out of range; it must be from 1 MiB to 8 GiB"),
        ("max_payload_bytes: 512KiB", "limits.max_payload_bytes: 512 KiB is out of range; it must be from 1 MiB"),
        ("max_payload_bytes: 1Gb", "limits.max_payload_bytes: '1Gb' is not a quantity; use a number of bytes or"),
        ("max_payload_bytes: true", "limits.max_payload_bytes: True is not a quantity"),
        ("max_task_log_bytes: 1000", "limits.max_task_log_bytes: 1,000 bytes is too small; it must be at least 64 KiB"),
        ("max_task_log_bytes: lots", "limits.max_task_log_bytes: 'lots' is not a quantity"),
        ("max_log_bytes: 1MiB", "limits.max_log_bytes: unknown field"),
    ],
)
def test_bad_limits_name_the_field_and_what_is_accepted(tmp_path: Path, text: str, expected: str) -> None:
    [issue] = _issues(tmp_path, f"limits:\n  {text}\n")
    assert expected in issue
    assert "levers9.yaml:2: " in issue


def test_size_errors_say_how_gb_is_read(tmp_path: Path) -> None:
    [issue] = _issues(tmp_path, "limits:\n  max_task_log_bytes: 8mb\n")
    assert "16GB = 16GiB" in issue
    assert "lowercase b would be bits" in issue


def test_the_schema_lets_editors_write_sizes_as_strings() -> None:
    import re

    from levers9.config.model import Config

    schema = Config.model_json_schema()["$defs"]
    for model, field in (
        ("LimitsConfig", "max_payload_bytes"),
        ("LimitsConfig", "max_task_log_bytes"),
        ("PoolConfig", "memory"),
    ):
        [string] = [s for s in schema[model]["properties"][field]["anyOf"] if s["type"] == "string"]
        assert re.match(string["pattern"], "512MiB")
        assert not re.match(string["pattern"], "1Gb")
