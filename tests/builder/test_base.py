"""Debian base layers from this machine's Debian mirror, built with the real mmdebstrap.

The bookworm base is built once per machine and recipe (``debian_base``,
about a minute here) and shared; one test builds another into a fresh cache
from two processes at once to show the lock makes that one build. Mirrors that
serve only some suites are small local HTTP servers holding Release files.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import textwrap
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from levers9.blueprints.spec import BlueprintError
from levers9.builder import base
from levers9.builder.base import BaseImageError, BaseLayer, base_image, build_base, python_versions
from levers9.engine.layers import extract_layer

pytestmark = pytest.mark.timeout(600)

#: chroot is in /usr/sbin, which a test runner's PATH may lack
CHROOT = shutil.which("chroot") or "/usr/sbin/chroot"
RELEASE = "Origin: Debian\nSuite: {suite}\nCodename: {suite}\nDate: Fri, 04 Dec 2026 03:54:28 UTC\n"


@pytest.fixture
def fake_mirror(tmp_path: Path) -> Iterator[Callable[..., str]]:
    """``fake_mirror(bookworm="Release", trixie="InRelease")``: a mirror URL serving those suites' Release files."""
    root = tmp_path / "www"
    root.mkdir()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, directory=str(root), **kwargs)  # type: ignore[arg-type]

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    def make(**suites: str) -> str:
        name = uuid.uuid4().hex  # a new URL each time: answers are kept per mirror for the process
        for suite, file in suites.items():
            where = root / name / "debian" / "dists" / suite
            where.mkdir(parents=True)
            (where / file).write_text(RELEASE.format(suite=suite))
        return f"http://127.0.0.1:{server.server_address[1]}/{name}/debian"

    try:
        yield make
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_this_machines_mirror_serves_its_own_debian() -> None:
    mirror = base.configured_mirror()
    sources = "\n".join(p.read_text() for p in sorted(Path("/etc/apt").rglob("*.sources")) if p.is_file())
    sources += Path("/etc/apt/sources.list").read_text() if Path("/etc/apt/sources.list").exists() else ""
    assert mirror in sources
    found = python_versions()
    print(f"{mirror} offers {found}")
    assert found["3.11"] == "bookworm"
    assert set(found.items()) <= set(base.SUITES.items())


def test_only_the_suites_a_mirror_serves_are_offered(fake_mirror: Callable[..., str]) -> None:
    assert python_versions(fake_mirror(bookworm="Release")) == {"3.11": "bookworm"}
    assert python_versions(fake_mirror(trixie="InRelease", bullseye="Release")) == {"3.9": "bullseye", "3.13": "trixie"}
    empty = fake_mirror()
    with pytest.raises(BaseImageError, match=f"the Debian mirror {empty} serves none of bullseye, bookworm, trixie"):
        python_versions(empty)


def test_an_unknown_python_version_names_those_the_mirror_offers(
    tmp_path: Path, fake_mirror: Callable[..., str]
) -> None:
    with pytest.raises(BlueprintError) as raised:
        base_image("3.7", tmp_path / "cache")
    assert raised.value.field == "python_version"
    assert "no Debian release on" in raised.value.problem
    assert "ships Python 3.7" in raised.value.problem
    assert "3.11 (Debian bookworm)" in raised.value.problem
    # served by Debian, but not by this mirror
    mirror = fake_mirror(bookworm="Release")
    with pytest.raises(BlueprintError, match=r"ships Python 3\.13; it offers 3\.11 \(Debian bookworm\)$"):
        build_base("3.13", tmp_path / "base.tar", mirror=mirror)
    with pytest.raises(BlueprintError, match="python_version: '3' is not a Python version"):
        base_image("3", tmp_path / "cache")
    assert not (tmp_path / "base.tar").exists()


def test_the_mirror_is_read_from_deb822_and_one_line_sources(tmp_path: Path) -> None:
    apt = tmp_path / "apt"
    (apt / "sources.list.d").mkdir(parents=True)
    assert base.configured_mirror(apt) == base.DEFAULT_MIRROR
    assert base.configured_security(apt) is None
    (apt / "sources.list").write_text(
        "# a comment\ndeb-src http://src.example/debian bookworm main\n"
        "deb [arch=amd64 signed-by=/k.gpg] http://one.example/debian/ bookworm main\n"
        "deb http://one.example/debian-security bookworm-security main\n"
    )
    assert base.configured_mirror(apt) == "http://one.example/debian"
    assert base.configured_security(apt) == "http://one.example/debian-security"
    (apt / "sources.list.d" / "debian.sources").write_text(
        textwrap.dedent("""\
        Types: deb
        URIs: http://off.example/debian
        Suites: bookworm
        Enabled: no

        Types: deb deb-src
        # the archive
        URIs: https://two.example/debian
        Suites: bookworm
          bookworm-updates
        Components: main

        Types: deb
        URIs: https://two.example/debian-security
        Suites: bookworm-security
        """)
    )
    assert base.configured_mirror(apt) == "https://two.example/debian"
    assert base.configured_security(apt) == "https://two.example/debian-security"


def test_an_unreachable_mirror_is_named(tmp_path: Path) -> None:
    mirror = f"http://127.0.0.1:{_closed_port()}/debian"
    with pytest.raises(BaseImageError, match=f"the Debian mirror {mirror} cannot be reached"):
        build_base("3.11", tmp_path / "base.tar", mirror=mirror)
    with pytest.raises(BaseImageError, match=f"the Debian mirror {mirror} cannot be reached"):
        base_image("3.12", tmp_path / "cache", mirror=mirror)  # listing what it offers needs it too
    with pytest.raises(BaseImageError, match=r"mirror: 'ftp://x\.example/debian' is not a Debian mirror's URL"):
        build_base("3.11", tmp_path / "base.tar", mirror="ftp://x.example/debian")
    with pytest.raises(BaseImageError, match=r"packages\[1\]: 'Bad Name' is not a Debian package name"):
        build_base("3.11", tmp_path / "base.tar", packages=["jq", "Bad Name"])
    assert list(tmp_path.iterdir()) == []


def test_without_mmdebstrap_the_error_says_how_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert shutil.which("mmdebstrap"), "these tests need mmdebstrap: apt-get install -y mmdebstrap"
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    with pytest.raises(BaseImageError, match="needs mmdebstrap, which is not on PATH: apt-get install -y mmdebstrap"):
        base_image("3.11", tmp_path / "cache")
    assert [p.name for p in (tmp_path / "cache").iterdir() if not p.name.endswith(".lock")] == []


def test_a_failing_mmdebstrap_is_quoted_and_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))  # where mmdebstrap makes its temporary root
    with pytest.raises(BaseImageError) as raised:
        build_base("3.11", tmp_path / "out" / "base.tar", packages=["levers9-no-such-package"])
    print(raised.value)
    assert "mmdebstrap failed with exit status" in str(raised.value)
    assert "levers9-no-such-package" in str(raised.value)  # apt's own words, from the tail of its output
    assert list((tmp_path / "out").iterdir()) == []
    assert list(scratch.iterdir()) == []
    assert str(tmp_path) not in Path("/proc/mounts").read_text()


def test_the_base_unpacks_as_a_layer_and_runs_its_python(debian_base: BaseLayer, tmp_path: Path) -> None:
    print(f"bookworm base: {debian_base.size / 2**20:.0f} MiB, {debian_base.diff_id}, {debian_base.path}")
    assert (debian_base.suite, debian_base.python_version) == ("bookworm", "3.11")
    assert debian_base.path.stat().st_size == debian_base.size
    with tarfile.open(debian_base.path) as tar:
        members = {m.name: m for m in tar}
    assert not [n for n, m in members.items() if m.isdev()], "the layer carries device nodes"
    assert members["./dev"].isdir()
    assert not [n for n in members if n.startswith("./dev/")]
    assert not {"./etc/resolv.conf", "./etc/hostname"} & set(members)
    assert not [n for n in members if n.endswith("EXTERNALLY-MANAGED")]
    assert not [n for n in members if n.startswith(("./usr/share/man/man", "./usr/share/locale/de"))]

    root = tmp_path / "root"
    root.mkdir()
    try:
        with debian_base.path.open("rb") as blob:
            tar_digest, blob_digest = extract_layer(blob, root, "the bookworm base")
        assert f"sha256:{tar_digest}" == f"sha256:{blob_digest}" == debian_base.diff_id
        assert (root / "usr/bin/python3").is_file() or (root / "usr/bin/python3").is_symlink()
        assert os.readlink(root / "bin") == "usr/bin"  # merged /usr
        sources = (root / "etc/apt/sources.list").read_text()
        assert f"deb {base.configured_mirror()} bookworm main" in sources
        assert list(debian_base.sources) == [line for line in sources.splitlines() if line]
        probe = (
            "import json, ssl, sys, venv; print(json.dumps({'v': list(sys.version_info[:2]), "
            "'cas': ssl.create_default_context().cert_store_stats()['x509_ca']}))"
        )
        ran = subprocess.run(
            [CHROOT, str(root), "/usr/bin/python3", "-c", probe],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env={"LANG": "C.UTF-8"},
        )
        assert ran.returncode == 0, ran.stderr
        seen = json.loads(ran.stdout)
        assert seen["v"] == [3, 11]
        assert seen["cas"] > 0
        pip = subprocess.run(
            [CHROOT, str(root), "/usr/bin/python3", "-m", "pip", "--version"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert pip.returncode == 0, pip.stderr
        assert "python 3.11" in pip.stdout
    finally:
        shutil.rmtree(root)
    config = debian_base.config()
    assert config["rootfs"] == {"type": "layers", "diff_ids": [debian_base.diff_id]}
    assert "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" in config["config"]["Env"]
    assert (config["os"], config["architecture"], config["created"]) == ("linux", "amd64", debian_base.created)


def test_a_second_call_reuses_the_cached_base(debian_base: BaseLayer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="levers9.builder.base")
    again = base_image("3.11", debian_base.path.parent.parent)  # the cache the fixture built it into
    assert again == debian_base
    assert not [r for r in caplog.records if "building" in r.getMessage()]


_BUILD = """
import logging, sys
from pathlib import Path
from levers9.builder.base import base_image
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
print(base_image("3.11", Path(sys.argv[1])).to_json())
"""


def test_concurrent_callers_build_one_base(tmp_path: Path) -> None:
    cache = tmp_path / "bases"
    try:
        argv = [sys.executable, "-c", _BUILD, str(cache)]
        procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
        outs = [p.communicate(timeout=540) for p in procs]
        assert [p.returncode for p in procs] == [0, 0], [err[-3000:] for _, err in outs]
        building = [line for _, err in outs for line in err.splitlines() if line.startswith("building the Debian")]
        assert len(building) == 1, building
        first, second = (json.loads(out) for out, _ in outs)
        assert first == second
        entries = [p.name for p in cache.iterdir() if not p.name.endswith(".lock")]
        assert entries == [Path(first["path"]).parent.name]
        print(f"one build for two callers: {first['diff_id']}")
    finally:
        shutil.rmtree(cache, ignore_errors=True)
