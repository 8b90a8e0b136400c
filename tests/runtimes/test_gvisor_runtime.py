"""gVisor's capability and checkpoint reports against the host's real runsc, and against stand-in builds."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

import levers9_gvisor
from levers9.hooks.types import CheckpointSupport, Isolation, RuntimeContext

Context = Callable[..., RuntimeContext]
RunTool = Callable[..., "subprocess.CompletedProcess[str]"]
WriteTool = Callable[[Path, str, str], Path]

OLD_FLAGS = """\
  -platform string
    \tspecifies which platform to use: ptrace (default), kvm. (default "ptrace")
  -platform_device_path string
"""
NEW_FLAGS = """\
  -nvproxy
    \tEXPERIMENTAL: enable support for Nvidia GPUs
  -platform string
    \tspecifies which platform to use: systrap (default), ptrace, kvm. (default "systrap")
"""


@pytest.fixture
def fake_runsc(tmp_path: Path, write_tool: WriteTool) -> Callable[..., Path]:
    """A stand-in runsc build; ``platforms=None`` makes its ``help platforms`` fail."""

    def make(*, platforms: str | None, flags: str) -> Path:
        listing = "echo 'not understood' >&2; exit 128" if platforms is None else f"printf '{platforms}'"
        script = f"""\
case "$1 $2" in
  "--version "*) echo "runsc version release-20240101.0"; echo "spec: 1.1.0" ;;
  "help platforms") {listing} ;;
  "flags "*) cat >&2 <<'FLAGS'
{flags}FLAGS
  ;;
  *) exit 2 ;;
esac
"""
        return write_tool(tmp_path / "bin", "runsc", script)

    return make


def platforms_of(runsc_path: str) -> set[str]:
    """The platforms the host's runsc lists, asked directly."""
    done = subprocess.run([runsc_path, "help", "platforms"], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return {line.strip() for line in done.stdout.splitlines() if line.strip()}


def has_nvproxy(runsc_path: str) -> bool:
    """Whether the host's runsc has the -nvproxy flag, asked directly."""
    done = subprocess.run([runsc_path, "flags"], capture_output=True, text=True, check=False)
    return "-nvproxy" in done.stdout + done.stderr


def test_parse_version() -> None:
    assert levers9_gvisor.parse_version("runsc version 0.0~20221219.0\nspec: 1.0.2-dev\n") == "0.0~20221219.0"
    assert levers9_gvisor.parse_version("runsc version release-20240101.0\n") == "release-20240101.0"
    assert levers9_gvisor.parse_version("runc version 1.1.5\n") is None


def test_parse_platforms() -> None:
    # runsc lists them in Go map order, different on every run: the parse sorts them
    assert levers9_gvisor.parse_help_platforms("ptrace\nkvm\n") == ("kvm", "ptrace")
    assert levers9_gvisor.parse_help_platforms("kvm\nptrace\n") == ("kvm", "ptrace")
    assert levers9_gvisor.parse_help_platforms("systrap\nptrace\nkvm\n\n") == ("kvm", "ptrace", "systrap")
    assert levers9_gvisor.parse_flag_platforms(OLD_FLAGS) == ("ptrace", "kvm")
    assert levers9_gvisor.parse_flag_platforms(NEW_FLAGS) == ("systrap", "ptrace", "kvm")
    assert levers9_gvisor.parse_flag_platforms("  -debug\n") == ()


def test_real_runsc_platforms_are_detected(require: Callable[[str], str]) -> None:
    runsc_path = require("runsc")
    real_platforms, real_has_nvproxy = platforms_of(runsc_path), has_nvproxy(runsc_path)
    info = levers9_gvisor.inspect_runsc("runsc")
    assert info.problem is None
    assert info.path == runsc_path
    assert set(info.platforms) == real_platforms
    assert "ptrace" in info.platforms
    assert info.nvproxy is real_has_nvproxy


def test_real_runsc_is_available_with_a_platform_it_has(
    run_tool: RunTool, context: Context, require: Callable[[str], str]
) -> None:
    runsc_path = require("runsc")
    report = levers9_gvisor.plugin.levers9_runtime_capabilities(context("gvisor", {"platform": "ptrace"}))
    assert report.available, report.unavailable_reason
    assert report.isolation is Isolation.SANDBOX
    assert report.checkpoint is True
    assert report.gpu is False
    assert run_tool(runsc_path, "--version").stdout.splitlines()[0] == f"runsc version {report.version}"


def test_default_platform_works_with_the_real_runsc(require: Callable[[str], str], context: Context) -> None:
    real_platforms = platforms_of(require("runsc"))
    # Debian 12's runsc predates systrap; 'auto' must still give a working sandbox, on ptrace.
    ctx = context("gvisor")
    report = levers9_gvisor.plugin.levers9_runtime_capabilities(ctx)
    assert report.available, report.unavailable_reason
    info = levers9_gvisor.inspect_runsc("runsc")
    expected = "systrap" if "systrap" in real_platforms else "ptrace"
    assert levers9_gvisor.resolve_platform(levers9_gvisor.GvisorSettings(), info) == expected
    assert levers9_gvisor.plugin.levers9_checkpoint_support(ctx).available  # type: ignore[union-attr]


def test_explicit_systrap_against_the_real_runsc(require: Callable[[str], str], context: Context) -> None:
    real_platforms = platforms_of(require("runsc"))
    ctx = context("gvisor", {"platform": "systrap"})
    report = levers9_gvisor.plugin.levers9_runtime_capabilities(ctx)
    assert report.version is not None
    if "systrap" in real_platforms:
        assert report.available, report.unavailable_reason
    else:
        # named explicitly: reported, never silently swapped for another platform
        assert not report.available
        reason = report.unavailable_reason or ""
        assert "'systrap'" in reason
        assert all(name in reason for name in real_platforms), reason
        assert report.checkpoint is False
        support = levers9_gvisor.plugin.levers9_checkpoint_support(ctx)
        assert support is not None
        assert not support.available
        assert support.reason == reason


def test_kvm_platform_against_the_real_runsc(require: Callable[[str], str], context: Context) -> None:
    real_platforms = platforms_of(require("runsc"))
    report = levers9_gvisor.plugin.levers9_runtime_capabilities(context("gvisor", {"platform": "kvm"}))
    usable = "kvm" in real_platforms and os.access("/dev/kvm", os.R_OK | os.W_OK)
    assert report.available is usable, report.unavailable_reason


def test_nvproxy_against_the_real_runsc(require: Callable[[str], str], context: Context) -> None:
    real_has_nvproxy = has_nvproxy(require("runsc"))
    settings = {"platform": "ptrace", "nvproxy": True}
    report = levers9_gvisor.plugin.levers9_runtime_capabilities(context("gvisor", settings))
    assert report.available is real_has_nvproxy
    assert report.gpu is real_has_nvproxy
    if not real_has_nvproxy:
        assert report.unavailable_reason
        assert "nvproxy" in report.unavailable_reason


def test_newer_build_with_systrap_and_nvproxy(fake_runsc: Callable[..., Path], context: Context) -> None:
    runsc = fake_runsc(platforms="systrap\\nptrace\\nkvm\\n", flags=NEW_FLAGS)
    report = levers9_gvisor.plugin.levers9_runtime_capabilities(
        context("gvisor", {"binary": str(runsc), "nvproxy": True})
    )
    assert report.available, report.unavailable_reason
    assert report.version == "release-20240101.0"
    assert report.gpu is True


def test_platforms_fall_back_to_the_flag_description(fake_runsc: Callable[..., Path], context: Context) -> None:
    runsc = fake_runsc(platforms=None, flags=OLD_FLAGS)
    info = levers9_gvisor.inspect_runsc(str(runsc))
    assert info.platforms == ("ptrace", "kvm")
    assert info.nvproxy is False
    assert levers9_gvisor.plugin.levers9_runtime_capabilities(context("gvisor", {"binary": str(runsc)})).available
    report = levers9_gvisor.plugin.levers9_runtime_capabilities(
        context("gvisor", {"binary": str(runsc), "platform": "systrap"})
    )
    assert not report.available
    assert report.unavailable_reason
    assert "'systrap'" in report.unavailable_reason


def test_unknown_platforms_are_reported(fake_runsc: Callable[..., Path], context: Context) -> None:
    runsc = fake_runsc(platforms=None, flags="  -debug\n")
    settings = {"binary": str(runsc), "platform": "ptrace"}
    report = levers9_gvisor.plugin.levers9_runtime_capabilities(context("gvisor", settings))
    assert not report.available
    assert report.unavailable_reason
    assert "could not tell which platforms" in report.unavailable_reason


def test_missing_binary_names_the_path(context: Context) -> None:
    settings = {"binary": "/opt/nowhere/runsc", "platform": "ptrace"}
    report = levers9_gvisor.plugin.levers9_runtime_capabilities(context("gvisor", settings))
    assert not report.available
    assert report.unavailable_reason
    assert "/opt/nowhere/runsc" in report.unavailable_reason
    assert report.checkpoint is False

    support = levers9_gvisor.plugin.levers9_checkpoint_support(context("gvisor", settings))
    assert support is not None
    assert not support.available
    assert support.mechanism == "runsc"
    assert support.reason
    assert "/opt/nowhere/runsc" in support.reason


def test_checkpoint_support(context: Context, require: Callable[[str], str]) -> None:
    require("runsc")
    support = levers9_gvisor.plugin.levers9_checkpoint_support(context("gvisor"))
    assert isinstance(support, CheckpointSupport)
    assert support.available
    assert support.mechanism == "runsc"


@pytest.mark.parametrize("name", ["runc", "process", "gVisor", "runsc"])
def test_checkpoint_support_ignores_other_runtimes(name: str, context: Context) -> None:
    assert levers9_gvisor.plugin.levers9_checkpoint_support(context(name)) is None


def test_auto_with_no_platform_it_can_choose(fake_runsc: Callable[..., Path], context: Context) -> None:
    runsc = fake_runsc(platforms="kvm\\n", flags=OLD_FLAGS)
    report = levers9_gvisor.plugin.levers9_runtime_capabilities(context("gvisor", {"binary": str(runsc)}))
    assert not report.available
    assert report.unavailable_reason
    assert "offers none of the platforms 'auto' chooses from (systrap, ptrace; it offers: kvm)" in (
        report.unavailable_reason
    )


def test_network_auto_says_which_stack_and_an_explicit_sandbox_refuses_rather_than_falls_back(
    require: Callable[[str], str], context: Context
) -> None:
    """What ``levers9 check`` shows for gVisor's network, against the real runsc: ``auto`` names the stack it
    chose and why; ``sandbox`` is available only where gVisor's own stack works here, and otherwise says so."""
    require("runsc")
    auto_ctx = context("gvisor", {"network": "auto"})
    info = levers9_gvisor.inspect_runsc("runsc")
    platform = levers9_gvisor.resolve_platform(levers9_gvisor.GvisorSettings(), info)
    assert info.path is not None
    assert platform is not None
    works, words = levers9_gvisor.sandbox_network_works(auto_ctx, info.path, platform)

    auto = levers9_gvisor.plugin.levers9_runtime_capabilities(auto_ctx)
    assert auto.available, auto.unavailable_reason
    sandbox = levers9_gvisor.plugin.levers9_runtime_capabilities(context("gvisor", {"network": "sandbox"}))
    network_notes = [note for note in auto.notes if note.startswith("network")]
    if works:
        assert network_notes == ["network 'auto': gVisor's own network stack ('sandbox')"]
        assert sandbox.available, sandbox.unavailable_reason
    else:
        assert len(network_notes) == 1
        assert network_notes[0].startswith("network 'auto' uses 'host'")
        assert words in network_notes[0]
        assert not sandbox.available
        assert sandbox.unavailable_reason is not None
        assert sandbox.unavailable_reason.startswith("network 'sandbox' is set, but runsc")
        assert "set runtime_settings.network to 'auto' or 'host'" in sandbox.unavailable_reason
    host = levers9_gvisor.plugin.levers9_runtime_capabilities(context("gvisor", {"network": "host"}))
    assert host.available
    assert [note for note in host.notes if note.startswith("network")] == []


def test_the_seccomp_note_follows_the_oci_seccomp_flag(
    require: Callable[[str], str], context: Context, fake_runsc: Callable[..., Path]
) -> None:
    """The real runsc here has -oci-seccomp, so the profile is applied in the sandbox; a build without it says so."""
    require("runsc")
    info = levers9_gvisor.inspect_runsc("runsc")
    real = levers9_gvisor.plugin.levers9_runtime_capabilities(context("gvisor", {"network": "host"}))
    if info.oci_seccomp:
        assert "seccomp: levers9's profile, applied inside the sandbox (-oci-seccomp)" in real.notes
        assert "--oci-seccomp" in levers9_gvisor.engine(context("gvisor", {"network": "host"})).flavor.argv
    old_build = fake_runsc(platforms="ptrace\n", flags=OLD_FLAGS)
    report = levers9_gvisor.plugin.levers9_runtime_capabilities(
        context("gvisor", {"binary": str(old_build), "network": "host"})
    )
    assert report.available, report.unavailable_reason
    assert any(note.startswith("seccomp: runsc") and "no -oci-seccomp flag" in note for note in report.notes)


def test_the_network_probe_leaves_no_cgroup(require: Callable[[str], str], context: Context) -> None:
    """The probe sandbox's cgroups (runsc names them by the probe's id) are removed with it."""
    require("runsc")
    info = levers9_gvisor.inspect_runsc("runsc")
    platform = levers9_gvisor.resolve_platform(levers9_gvisor.GvisorSettings(), info)
    assert info.path is not None
    assert platform is not None
    before = {*Path("/sys/fs/cgroup").glob("*/l9-probe-*"), *Path("/sys/fs/cgroup").glob("l9-probe-*")}
    levers9_gvisor._NETWORK_CACHE.clear()
    levers9_gvisor.sandbox_network_works(context("gvisor", {"network": "auto"}), info.path, platform)
    assert set(Path("/sys/fs/cgroup").glob("*/l9-probe-*")) - before == set()
    assert set(Path("/sys/fs/cgroup").glob("l9-probe-*")) - before == set()
