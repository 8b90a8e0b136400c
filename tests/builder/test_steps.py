"""What a step is made of without a container: copy layers, step scripts, history lines."""

from __future__ import annotations

import hashlib
import io
import shlex
import tarfile
from pathlib import Path

import pytest

from levers9.blueprints.spec import Step
from levers9.builder.steps import StepFailed, copy_layer, describe, step_script


def tar_of(path: Path, *members: tuple[tarfile.TarInfo, bytes | None]) -> str:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return f"sha256:{hashlib.sha256(path.read_bytes()).hexdigest()}"


def member(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, linkname, 0o644
    return info


def test_a_copy_layer_is_its_files_under_the_destination(tmp_path: Path) -> None:
    source = tmp_path / "files.tar"
    digest = tar_of(
        source,
        (member("pkg", tarfile.DIRTYPE), None),
        (member("pkg/a.py"), b"A = 1\n"),
        (member("pkg/b.py", tarfile.LNKTYPE, "pkg/a.py"), None),
        (member("pkg/up", tarfile.SYMTYPE, "../elsewhere"), None),
    )
    copy_layer(source, digest, "/opt/lib", tmp_path / "layer.tar")
    with tarfile.open(tmp_path / "layer.tar") as layer:
        members = {m.name: m for m in layer.getmembers()}
        assert list(members) == ["opt/lib/pkg", "opt/lib/pkg/a.py", "opt/lib/pkg/b.py", "opt/lib/pkg/up"]
        assert layer.extractfile(members["opt/lib/pkg/a.py"]).read() == b"A = 1\n"  # type: ignore[union-attr]
    assert members["opt/lib/pkg/b.py"].linkname == "opt/lib/pkg/a.py", "a hard link follows its file"
    assert members["opt/lib/pkg/up"].linkname == "../elsewhere", "a symlink's target is the user's"
    copy_layer(source, digest, "/", tmp_path / "root.tar")
    with tarfile.open(tmp_path / "root.tar") as layer:
        assert layer.getnames() == ["pkg", "pkg/a.py", "pkg/b.py", "pkg/up"]


@pytest.mark.parametrize(
    ("bad", "said"),
    [
        (member("/etc/passwd"), "absolute name '/etc/passwd'"),
        (member("pkg/../../etc/passwd"), "climbs out with '..'"),
        (member("pkg/hard", tarfile.LNKTYPE, "../../etc/shadow"), "climbs out with '..'"),
        (member("pkg/dev", tarfile.CHRTYPE), "not a file, directory or link"),
    ],
)
def test_a_copy_tar_may_not_leave_its_destination(tmp_path: Path, bad: tarfile.TarInfo, said: str) -> None:
    source = tmp_path / "files.tar"
    digest = tar_of(source, (member("pkg", tarfile.DIRTYPE), None), (bad, b"x" if bad.isreg() else None))
    with pytest.raises(StepFailed, match=said):
        copy_layer(source, digest, "/opt", tmp_path / "layer.tar")


def test_a_copy_tar_must_be_what_its_digest_says(tmp_path: Path) -> None:
    source = tmp_path / "files.tar"
    tar_of(source, (member("a"), b"a"))
    with pytest.raises(StepFailed, match="not sha256:0000"):
        copy_layer(source, "sha256:" + "0" * 64, "/opt", tmp_path / "layer.tar")


def test_scripts_and_history_lines() -> None:
    apt = step_script(Step("apt", ("jq", "curl=7.88.1-10")), proxy_url="http://10.0.0.1:3128")
    assert "install -y --no-install-recommends jq curl=7.88.1-10" in apt
    assert "Acquire::http::Proxy=http://10.0.0.1:3128" in apt
    assert "Acquire::http::Pipeline-Depth=0" in apt
    assert apt.rstrip().endswith("rm -rf /var/lib/apt/lists/*")
    pip = step_script(Step("pip", ("six", "requests[socks]>=2; python_version > '3'")), proxy_url=None)
    assert shlex.split(pip) == ["python3", "-m", "pip", "install", "six", "requests[socks]>=2; python_version > '3'"]
    assert step_script(Step("run", ("echo $HOME",)), proxy_url=None) == "echo $HOME"
    assert describe(Step("run", ("make",), secrets=("TOKEN", "KEY"))) == "RUN (secrets: TOKEN, KEY) /bin/sh -c make"
    assert describe(Step("env", env=(("A", "1"), ("B", "2")))) == "ENV A=1 B=2"
