"""The nvidia-smi CSV parser, and the built-in discovery plugin run against a fake nvidia-smi."""

from __future__ import annotations

import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pluggy
import pytest

import levers9.hooks.spec as spec
from levers9.discovery import nvidia_smi as plugin
from levers9.discovery.nvidia_smi_query import COMMAND, QUERY, parse_query_gpu
from levers9.hooks.markers import PROJECT
from levers9.hooks.types import GpuDevice

DATA = Path(__file__).resolve().parents[1] / "data" / "gpu" / "nvidia_smi"


# --------------------------------------------------------------------------- the parser


def test_query_and_command() -> None:
    assert QUERY == "index,uuid,name,memory.total"
    assert COMMAND == [
        "nvidia-smi",
        "--query-gpu=index,uuid,name,memory.total",
        "--format=csv,noheader,nounits",
    ]


def test_parse_eight_h100() -> None:
    devices = parse_query_gpu((DATA / "h100_sxm_8x.csv").read_text())
    assert [d.index for d in devices] == list(range(8))
    assert len({d.uuid for d in devices}) == 8
    assert all(d.uuid.startswith("GPU-") for d in devices)
    assert {d.model for d in devices} == {"NVIDIA H100 80GB HBM3"}
    assert {d.gpu for d in devices} == {"H100"}
    assert {d.memory_mib for d in devices} == {81559}


@pytest.mark.parametrize(
    ("filename", "expected"),
    [
        ("t4_1x.csv", [("Tesla T4", "T4", 15360)]),
        (
            "workstation_rtx4090_rtx3090.csv",
            [("NVIDIA GeForce RTX 4090", "RTX4090", 24564), ("NVIDIA GeForce RTX 3090", "RTX3090", 24576)],
        ),
        ("a100_sxm4_40gb_8x.csv", [("NVIDIA A100-SXM4-40GB", "A100-40", 40960)] * 8),
        ("h100_nvl_2x.csv", [("NVIDIA H100 NVL", "H100-NVL", 95830)] * 2),
        ("gh200_1x.csv", [("NVIDIA GH200 480GB", "GH200", 97871)]),
    ],
)
def test_parse_recorded(filename: str, expected: list[tuple[str, str | None, int]]) -> None:
    devices = parse_query_gpu((DATA / filename).read_text())
    assert [(d.model, d.gpu, d.memory_mib) for d in devices] == expected


def test_parse_tolerates_whitespace_blank_lines_and_crlf() -> None:
    text = "\r\n  0 ,GPU-aaaa,  NVIDIA L4 ,23034  \r\n\r\n\t\n1, GPU-bbbb, NVIDIA L4, 23034\r\n"
    devices = parse_query_gpu(text)
    assert [(d.index, d.uuid, d.model, d.gpu, d.memory_mib) for d in devices] == [
        (0, "GPU-aaaa", "NVIDIA L4", "L4", 23034),
        (1, "GPU-bbbb", "NVIDIA L4", "L4", 23034),
    ]


@pytest.mark.parametrize("memory", ["[N/A]", "[Not Supported]", "N/A", ""])
def test_parse_unreported_memory_is_zero(memory: str) -> None:
    (device,) = parse_query_gpu(f"0, GPU-1111, NVIDIA H100 80GB HBM3, {memory}\n")
    assert device.memory_mib == 0
    assert device.gpu == "H100"


def test_parse_unreported_memory_leaves_a_bare_a100_unresolved() -> None:
    (device,) = parse_query_gpu("0, GPU-1111, NVIDIA A100-SXM4, [N/A]\n")
    assert device.gpu is None
    (device,) = parse_query_gpu("0, GPU-1111, NVIDIA A100-SXM4, 81920\n")
    assert device.gpu == "A100-80"


def test_parse_accepts_quoted_fields_and_units() -> None:
    (device,) = parse_query_gpu('3, "GPU-2222", "NVIDIA A100 80GB PCIe", 81920 MiB\n')
    assert (device.index, device.uuid, device.model, device.gpu, device.memory_mib) == (
        3,
        "GPU-2222",
        "NVIDIA A100 80GB PCIe",
        "A100-80",
        81920,
    )


def test_parse_empty_output_is_no_gpus() -> None:
    assert parse_query_gpu("") == []
    assert parse_query_gpu("\n\n") == []


@pytest.mark.parametrize(
    ("bad_line", "reason"),
    [
        ("1, GPU-2222, NVIDIA H100 80GB HBM3", "expected 4 fields"),
        ("1, GPU-2222, NVIDIA H100, 80GB HBM3, 81559", "expected 4 fields"),
        ("one, GPU-2222, NVIDIA H100 80GB HBM3, 81559", "index is not a number"),
        ("-1, GPU-2222, NVIDIA H100 80GB HBM3, 81559", "negative index"),
        ("1, GPU-2222, NVIDIA H100 80GB HBM3, lots", "memory.total is not a number"),
        ("1, , NVIDIA H100 80GB HBM3, 81559", "empty uuid or name"),
        ("Unable to determine the device handle for GPU0000:1B:00.0: Unknown Error", "expected 4 fields"),
    ],
)
def test_parse_malformed_line_names_line_number_and_content(bad_line: str, reason: str) -> None:
    text = f"0, GPU-1111, NVIDIA H100 80GB HBM3, 81559\n{bad_line}\n"
    with pytest.raises(ValueError, match="line 2") as info:
        parse_query_gpu(text)
    assert reason in str(info.value)
    assert repr(bad_line) in str(info.value)


# --------------------------------------------------------------------------- the discovery plugin


def _fake_nvidia_smi(
    path: Path,
    *,
    stdout_file: Path | None = None,
    stderr_text: str = "",
    stdout_text: str = "",
    status: int = 0,
) -> Path:
    """Write an executable that stands in for nvidia-smi and insists on being asked the right question."""
    expected = " ".join(COMMAND[1:])
    lines = [
        "#!/bin/sh",
        f'if [ "$*" != {shlex.quote(expected)} ]; then echo "unexpected arguments: $*" >&2; exit 64; fi',
    ]
    if stdout_file is not None:
        # shell builtins only: the tests run it with a PATH that holds nothing else
        source = shlex.quote(str(stdout_file))
        lines.append(f'while IFS= read -r line || [ -n "$line" ]; do echo "$line"; done < {source}')
    if stdout_text:
        lines.append(f"printf '%s' {shlex.quote(stdout_text)}")
    if stderr_text:
        lines.append(f"printf '%s' {shlex.quote(stderr_text)} >&2")
    lines.append(f"exit {status}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


@pytest.fixture
def no_path_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A PATH with no nvidia-smi on it and no override set, whatever the host has installed."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv(plugin.ENV_VAR, raising=False)
    return empty


def test_hook_levers9_gpu_devices(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_path_nvidia_smi: Path) -> None:
    fake = _fake_nvidia_smi(tmp_path / "tools" / "my-nvidia-smi", stdout_file=DATA / "h100_sxm_8x.csv")
    monkeypatch.setenv(plugin.ENV_VAR, str(fake))

    devices = plugin.levers9_gpu_devices()
    assert len(devices) == 8
    assert all(isinstance(d, GpuDevice) for d in devices)
    assert {d.gpu for d in devices} == {"H100"}
    assert [d.index for d in devices] == list(range(8))

    # and through pluggy, as the core calls it: the implementation matches the spec
    manager = pluggy.PluginManager(PROJECT)
    manager.add_hookspecs(spec)
    manager.register(plugin, name="nvidia_smi")
    (answer,) = manager.hook.levers9_gpu_devices()
    assert answer == devices


def test_found_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_path_nvidia_smi: Path) -> None:
    _fake_nvidia_smi(no_path_nvidia_smi / "nvidia-smi", stdout_file=DATA / "workstation_rtx4090_rtx3090.csv")
    devices = plugin.levers9_gpu_devices()
    assert [(d.model, d.gpu) for d in devices] == [
        ("NVIDIA GeForce RTX 4090", "RTX4090"),
        ("NVIDIA GeForce RTX 3090", "RTX3090"),
    ]


def test_absent_binary_means_no_gpus(no_path_nvidia_smi: Path) -> None:
    assert plugin.find_nvidia_smi() is None
    assert plugin.levers9_gpu_devices() == []


def test_driver_failure_raises_with_nvidia_smi_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_path_nvidia_smi: Path
) -> None:
    failure = (DATA / "driver_failure.txt").read_text()
    fake = _fake_nvidia_smi(tmp_path / "nvidia-smi", stderr_text=failure, status=9)
    monkeypatch.setenv(plugin.ENV_VAR, str(fake))
    with pytest.raises(RuntimeError) as info:
        plugin.levers9_gpu_devices()
    message = str(info.value)
    assert "couldn't communicate with the NVIDIA driver" in message
    assert "status 9" in message


def test_failure_reported_on_stdout_is_reported_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_path_nvidia_smi: Path
) -> None:
    failure = (DATA / "driver_failure.txt").read_text()
    fake = _fake_nvidia_smi(tmp_path / "nvidia-smi", stdout_text=failure, status=9)
    monkeypatch.setenv(plugin.ENV_VAR, str(fake))
    with pytest.raises(RuntimeError, match="couldn't communicate with the NVIDIA driver"):
        plugin.levers9_gpu_devices()


def test_no_devices_found_is_no_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_path_nvidia_smi: Path) -> None:
    fake = _fake_nvidia_smi(tmp_path / "nvidia-smi", stdout_text="No devices were found\n", status=6)
    monkeypatch.setenv(plugin.ENV_VAR, str(fake))
    assert plugin.levers9_gpu_devices() == []


def test_override_pointing_nowhere_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_path_nvidia_smi: Path
) -> None:
    monkeypatch.setenv(plugin.ENV_VAR, str(tmp_path / "missing" / "nvidia-smi"))
    with pytest.raises(RuntimeError, match=plugin.ENV_VAR):
        plugin.levers9_gpu_devices()


def test_hung_nvidia_smi_times_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_path_nvidia_smi: Path) -> None:
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\nexec /bin/sleep 30\n")
    fake.chmod(0o755)
    monkeypatch.setenv(plugin.ENV_VAR, str(fake))
    monkeypatch.setattr(plugin, "TIMEOUT_S", 0.3)
    with pytest.raises(RuntimeError, match="did not answer"):
        plugin.levers9_gpu_devices()


def test_unparseable_output_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_path_nvidia_smi: Path) -> None:
    fake = _fake_nvidia_smi(tmp_path / "nvidia-smi", stdout_text="this is not csv output\n")
    monkeypatch.setenv(plugin.ENV_VAR, str(fake))
    with pytest.raises(ValueError, match="line 1"):
        plugin.levers9_gpu_devices()


def test_plugin_module_stays_light() -> None:
    """Workers import every discovery plugin at start; this one must not drag SDKs or the server in."""
    heavy = ["boto3", "oci", "kubernetes", "pynvml", "torch", "fastapi", "sqlalchemy", "grpc", "httpx"]
    code = (
        "import sys, levers9.discovery.nvidia_smi, levers9.gpu; "
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({heavy!r})))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
