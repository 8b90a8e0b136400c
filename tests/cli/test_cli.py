"""The levers9 command, run as a user runs it: a subprocess of the installed package."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from levers9.__about__ import __version__
from tests.conftest import Installed

HEAVY = ["boto3", "botocore", "oci", "kubernetes", "docker", "paramiko"]


def test_version(cli: Callable[..., Any]) -> None:
    result = cli("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"levers9 {__version__}"


@pytest.mark.parametrize("argv", [["--help"], ["plugins"], ["plugins", "--json"], ["config", "--help"]])
def test_cli_start_imports_no_heavy_sdk(argv: list[str], tmp_path: Path) -> None:
    probe = textwrap.dedent(
        f"""
        import json, sys
        from levers9.cli.main import app
        try:
            app({argv!r})
        except SystemExit:
            pass
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY!r})
        sys.stderr.write("HEAVY=" + json.dumps(heavy) + "\\n")
        """
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    line = next(x for x in proc.stderr.splitlines() if x.startswith("HEAVY="))
    assert json.loads(line.removeprefix("HEAVY=")) == [], f"levers9 {' '.join(argv)} imported heavy SDKs"


def test_plugins_json_lists_builtin_providers_and_runtimes_with_hooks(cli: Callable[..., Any]) -> None:
    result = cli("plugins", "--json")
    assert result.returncode == 0, result.stderr
    plugins = {p["name"]: p for p in json.loads(result.stdout)}
    for provider in ("local", "local_k8s", "attached_cluster", "ec2", "oci", "lambda_labs", "agent_machine"):
        assert plugins[provider]["builtin"] is True
        assert plugins[provider]["status"] == "loaded"
        assert "levers9_provider_settings" in plugins[provider]["hooks"], provider
    for runtime in ("runc", "gvisor", "process"):
        assert "runtime" in plugins[runtime]["roles"], runtime
        assert "levers9_runtime_capabilities" in plugins[runtime]["hooks"]
    assert sorted(plugins["criu"]["hooks"]) == ["levers9_checkpoint", "levers9_checkpoint_support", "levers9_restore"]
    assert plugins["nvidia_smi"]["hooks"] == ["levers9_gpu_devices"]
    assert plugins["toycloud"]["distribution"] == "levers9-toycloud"
    assert plugins["toycloud"]["builtin"] is False


def test_broken_plugin_is_reported_and_others_keep_working(cli: Callable[..., Any], installed: Installed) -> None:
    installed.add("levers9-broken", {"broken": "l9_broken"}, {"l9_broken": "raise ImportError('needs libfoo')\n"})
    result = cli("plugins")
    assert result.returncode == 0
    assert "broken" in result.stdout
    assert "failed" in result.stdout
    assert "plugin 'broken' (l9_broken) failed to load: import failed: ImportError: needs libfoo" in result.stderr
    assert "ec2" in result.stdout

    as_json = {p["name"]: p for p in json.loads(cli("plugins", "--json").stdout)}
    assert as_json["broken"]["status"] == "failed"
    assert as_json["broken"]["error"] == "import failed: ImportError: needs libfoo"
    assert as_json["ec2"]["status"] == "loaded"


def test_broken_plugin_fails_the_command_in_strict_mode(cli: Callable[..., Any], installed: Installed) -> None:
    installed.add("levers9-broken", {"broken": "l9_broken"}, {"l9_broken": "raise ImportError('needs libfoo')\n"})
    result = cli("plugins", env={"LEVERS9_PLUGINS_STRICT": "1"})
    assert result.returncode == 1
    assert "broken: import failed: ImportError: needs libfoo" in result.stderr


def test_blocked_plugins_are_hidden_unless_all(cli: Callable[..., Any]) -> None:
    env = {"LEVERS9_PLUGINS_BLOCK": "oci"}
    names = {p["name"] for p in json.loads(cli("plugins", "--json", env=env).stdout)}
    assert "oci" not in names
    everything = {p["name"]: p for p in json.loads(cli("plugins", "--json", "--all", env=env).stdout)}
    assert everything["oci"]["status"] == "blocked"


def test_config_check_ok_and_failing(cli: Callable[..., Any], tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(
        "pools:\n  t4:\n    provider: toycloud\n    runtime: process\n    workspace: team\n    gpu: t4\n"
        "    settings: {state_dir: /tmp/t}\n"
    )
    result = cli("config", "check", str(good))
    assert result.returncode == 0, result.stderr
    assert "ok, 1 pool(s)" in result.stdout
    assert "t4: provider toycloud, runtime process, 1x T4" in result.stdout

    # a pool that isolates nothing must name the one workspace it serves: the controlplane would not start
    shared = tmp_path / "shared.yaml"
    shared.write_text(good.read_text().replace("    workspace: team\n", ""))
    result = cli("config", "check", str(shared))
    assert result.returncode == 1
    assert "pools.t4.workspace: runtime 'process' isolates nothing, so pool 't4' serves one workspace" in result.stderr

    # a pool set to build images on a runtime that cannot capture a container's changes would fail every build
    builds = tmp_path / "builds.yaml"
    builds.write_text(good.read_text().replace("    workspace: team\n", "    workspace: team\n    builds: true\n"))
    result = cli("config", "check", str(builds))
    assert result.returncode == 1
    assert "pools.t4.builds: runtime 'process' cannot capture a container's changes" in result.stderr
    assert "builds need runtime runc or gvisor" in result.stderr

    bad = tmp_path / "bad.yaml"
    bad.write_text("pools:\n  t4:\n    provider: toycloud\n    gpu: RTX-4900\n")
    result = cli("config", "check", str(bad))
    assert result.returncode == 1
    assert f"{bad}:4: pools.t4.gpu: unknown GPU type 'RTX-4900'" in result.stderr
    assert "RTX4090" in result.stderr


def test_config_check_uses_env_path(cli: Callable[..., Any], tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("pools: {}\n")
    result = cli("config", "check", env={"LEVERS9_CONFIG": str(path)})
    assert result.returncode == 0
    assert f"{path}: ok, 0 pool(s)" in result.stdout


def test_config_schema_embeds_provider_settings(cli: Callable[..., Any]) -> None:
    result = cli("config", "schema")
    assert result.returncode == 0, result.stderr
    schema = json.loads(result.stdout)
    pool = schema["$defs"]["PoolConfig"]
    assert "ec2" in pool["properties"]["provider"]["enum"]
    branches = {b["if"]["properties"].get("provider", {}).get("const"): b for b in pool["allOf"]}
    ec2_settings = branches["ec2"]["then"]["properties"]["settings"]
    assert "availability_zones" in ec2_settings["properties"]
    assert "region" not in ec2_settings["properties"]  # a pool's region is the single source
    assert ec2_settings.get("additionalProperties") is False
    for ref in _refs(schema):
        name = ref.removeprefix("#/$defs/")
        assert name in schema["$defs"], f"dangling $ref {ref}"


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return found + [r for v in node.values() for r in _refs(v)]
    if isinstance(node, list):
        return [r for v in node for r in _refs(v)]
    return []


def test_gpu_normalize(cli: Callable[..., Any]) -> None:
    result = cli("gpu", "normalize", "NVIDIA H100 80GB HBM3", "Tesla T4", "NVIDIA-A100-SXM4-40GB")
    assert result.returncode == 0, result.stderr
    assert [line.split("\t")[1] for line in result.stdout.splitlines()] == ["H100", "T4", "A100-40"]

    result = cli("gpu", "normalize", "--json", "NVIDIA GeForce RTX 4090", "Voodoo2")
    assert result.returncode == 1
    rows = json.loads(result.stdout)
    assert rows[0]["canonical"] == "RTX4090"
    assert rows[1]["canonical"] is None


def test_global_config_option_sets_the_plugin_policy(cli: Callable[..., Any], tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("plugins:\n  block: [oci, ec2]\n")
    names = {p["name"] for p in json.loads(cli("--config", str(path), "plugins", "--json").stdout)}
    assert "oci" not in names
    assert "ec2" not in names
    assert "lambda_labs" in names
    result = cli("--config", str(path), "config", "check")
    assert result.returncode == 0, result.stderr
    assert f"{path}: ok, 0 pool(s)" in result.stdout
