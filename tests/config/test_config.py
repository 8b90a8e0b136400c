"""Config loading: every error names the file, the line, the field, the value and what is accepted."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from levers9.config.load import ConfigError, load_config, parse_config
from levers9.config.quantities import parse_memory_mib
from levers9.hooks.manager import PluginPolicy, load_plugins

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "levers9.yaml"
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def load(path: Path) -> object:
    loaded = load_config(path, plugins=load_plugins(PluginPolicy()))
    loaded.hooks.close()
    return loaded


def problems(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load(path)
    return [str(issue) for issue in info.value.issues]


TOY = """
pools:
  t4:
    provider: toycloud
    runtime: process
    gpu: {gpu}
    settings:
      state_dir: /tmp/toy
"""


def test_gpu_typo_names_file_line_field_and_suggestions(tmp_path: Path) -> None:
    path = write(tmp_path, TOY.format(gpu="H10"))
    [issue] = problems(path)
    assert issue.startswith(f"{path}:5: pools.t4.gpu:")
    assert "did you mean H100" in issue
    assert "(got 'H10')" in issue


def test_gpu_aliases_become_canonical(tmp_path: Path) -> None:
    loaded = load(write(tmp_path, TOY.format(gpu="a100-80gb")))
    assert loaded.pools["t4"].gpu == "A100-80"  # type: ignore[attr-defined]
    assert loaded.pools["t4"].gpu_count == 1  # type: ignore[attr-defined]


def test_provider_typo_lists_installed_providers(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        pools:
          cpu:
            provider: toycloude
            runtime: process
        """,
    )
    [issue] = problems(path)
    assert issue.startswith(f"{path}:3: pools.cpu.provider:")
    assert "unknown provider 'toycloude'" in issue
    assert "Did you mean 'toycloud'" in issue
    assert "ec2" in issue
    assert "lambda_labs" in issue


def test_provider_settings_validated_by_the_plugin_with_lines(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        pools:
          t4:
            provider: toycloud
            runtime: process
            settings:
              state_dir: /tmp/toy
              capacity: {T4: lots}
              stat_dir: /tmp/typo
        """,
    )
    issues = problems(path)
    assert len(issues) == 2
    assert any(i.startswith(f"{path}:7: pools.t4.settings.capacity.T4:") and "'lots'" in i for i in issues)
    extra = next(i for i in issues if "stat_dir" in i)
    assert extra.startswith(f"{path}:8: pools.t4.settings.stat_dir:")
    assert "Did you mean 'state_dir'?" in extra
    assert "Accepted: state_dir, capacity" in extra


def test_unknown_top_level_field_lists_accepted(tmp_path: Path) -> None:
    path = write(tmp_path, "listen:\n  grpc_port: 1993\npool: {}\n")
    [issue] = problems(path)
    assert issue.startswith(f"{path}:3: pool:")
    assert "Did you mean 'pools'?" in issue
    assert "Accepted: version, data_dir, state, listen, plugins, scheduler, checkpoints, limits, pools" in issue


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        listen:
          grpc_port: 70000
        pools:
          a:
            provider: toycloud
            gpu: T4
            gpu_count: 3
            min_workers: 5
            max_workers: 2
        """,
    )
    text = "\n".join(problems(path))
    assert f"{path}:2: listen.grpc_port:" in text
    assert "less than or equal to 65535" in text
    assert "gpu_count must be 1, 2, 4 or 8" in text


def test_duplicate_keys_are_errors(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        pools:
          a:
            provider: toycloud
          a:
            provider: ec2
        """,
    )
    [issue] = problems(path)
    assert issue == f"{path}:4: duplicate key 'a' (first defined on line 2)"


def test_yaml_syntax_error_has_a_line(tmp_path: Path) -> None:
    path = write(tmp_path, "pools:\n  a: [unclosed\n")
    [issue] = problems(path)
    assert issue.startswith(f"{path}:3: not valid YAML")


def test_pool_fallback_is_refused_pointing_to_the_request_preference(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        pools:
          gpu:
            provider: toycloud
            runtime: process
            gpu: T4
            settings: {state_dir: /tmp/t}
            fallback:
              to: [cpu]
        """,
    )
    [issue] = problems(path)
    assert issue.startswith(f"{path}:7: pools.gpu.fallback:")
    assert "gpu=['H100', 'L40S', 'cpu']" in issue


def test_unknown_runtime_and_plugin_policy_names(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        plugins:
          block: [ec22]
        pools:
          a:
            provider: toycloud
            runtime: gviser
            settings: {state_dir: /tmp/t}
        """,
    )
    issues = problems(path)
    assert any(i.startswith(f"{path}:2: plugins.block[0]:") and "Did you mean 'ec2'" in i for i in issues)
    assert any(i.startswith(f"{path}:6: pools.a.runtime:") and "'gvisor'" in i for i in issues)


def test_missing_explicit_file(tmp_path: Path) -> None:
    [issue] = problems(tmp_path / "nope.yaml")
    assert issue == f"{tmp_path / 'nope.yaml'}: no such file"


def test_defaults_without_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEVERS9_HOME", str(tmp_path))
    loaded = load_config(plugins=load_plugins(PluginPolicy()))
    loaded.hooks.close()
    assert loaded.file is None
    assert loaded.pools == {}
    assert loaded.config.listen.grpc_port == 1993
    assert loaded.config.database_url == f"sqlite:///{tmp_path / 'data' / 'levers9.db'}"
    assert loaded.config.state.redis_url is None


def test_example_config_loads() -> None:
    loaded = load_config(REPO / "examples" / "levers9.yaml", plugins=load_plugins(PluginPolicy()))
    loaded.hooks.close()
    providers = {pool.provider for pool in loaded.pools.values()}
    assert {"local", "ec2", "oci", "lambda_labs", "local_k8s", "attached_cluster", "agent_machine"} <= providers


@pytest.mark.parametrize(
    ("value", "mib"),
    [(512, 512), ("512MiB", 512), ("16GiB", 16384), ("16G", 16384), ("1.5Gi", 1536), ("1TiB", 1048576)],
)
def test_memory_quantities(value: object, mib: int) -> None:
    assert parse_memory_mib(value) == mib


@pytest.mark.parametrize("value", ["lots", "16 parsecs", -1, 0, True, "0.3MiB"])
def test_bad_memory_quantities(value: object) -> None:
    with pytest.raises(ValueError, match=r"MiB|size|boolean"):
        parse_memory_mib(value)


def test_parse_only_pass_reports_structure_errors() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config("pools:\n  Bad_Name:\n    provider: x\n", "inline.yaml")
    [issue] = info.value.issues
    assert issue.file == "inline.yaml"
    assert issue.line == 2
    assert "pools.Bad_Name" in issue.path


def test_unknown_nested_settings_key_lists_that_models_fields(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        pools:
          lab:
            provider: agent_machine
            settings:
              worker_image: levers9/worker:1
              ssh:
                user: ops
                jump: {hots: bastion.example.com}
        """,
    )
    missing, unknown = problems(path)
    assert missing == f"{path}:8: pools.lab.settings.ssh.jump.host: required field is missing"
    assert unknown.startswith(f"{path}:8: pools.lab.settings.ssh.jump.hots: unknown field 'hots'. Did you mean 'host'")
    assert unknown.endswith("Accepted: host, port, user")


def test_checkpoint_storage_is_checked_when_the_config_is_read(tmp_path: Path) -> None:
    path = write(tmp_path, "checkpoints:\n  storage_url: ftp://files.example.com/ck\n")
    [issue] = problems(path)
    assert issue.startswith(f"{path}:2: checkpoints.storage_url:")
    assert "s3://bucket/prefix" in issue
    good = write(tmp_path, "checkpoints:\n  storage_url: s3://ckpts/levers9?region=eu-west-1\n  cache_max: 5GiB\n")
    loaded = load_config(good, plugins=load_plugins(PluginPolicy()))
    loaded.hooks.close()
    assert loaded.config.checkpoints.cache_max == 5120


@pytest.mark.parametrize("key", ["region", "regions"])
def test_a_region_setting_points_to_the_pool_field_for_any_provider(tmp_path: Path, key: str) -> None:
    """toycloud, a third party's provider, gets the message the built-in clouds give, not ``unknown field``."""
    path = write(
        tmp_path,
        f"""
        pools:
          t4:
            provider: toycloud
            runtime: process
            gpu: T4
            settings:
              state_dir: /tmp/toy
              {key}: eu-1
        """,
    )
    [issue] = problems(path)
    assert issue.startswith(f"{path}:6: pools.t4.settings: {key} moved: set pools.t4.region (or regions) instead")
    assert "docs/config.md" in issue
    assert "unknown field" not in issue
