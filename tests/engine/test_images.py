"""Images built here with tarfile, resolved into the layer cache, and mounted the way a worker mounts them."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import platform
import shutil
import stat
import subprocess
import sys
import tarfile
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from levers9.engine.host_image import host_layout
from levers9.engine.images import HostBind, ImageConfig, ImageError, ImageStore

MTIME = 1_700_000_000
HOST_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
OTHER_ARCH = "s390x" if HOST_ARCH != "s390x" else "amd64"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"


# ---------------------------------------------------------------------- building images


@dataclass
class Member:
    name: str
    kind: bytes = tarfile.REGTYPE
    data: bytes = b""
    mode: int = 0o644
    link: str = ""
    uid: int = 0
    gid: int = 0
    pax: dict[str, str] = field(default_factory=dict)


def file(name: str, data: bytes = b"", mode: int = 0o644, uid: int = 0, gid: int = 0) -> Member:
    return Member(name, data=data, mode=mode, uid=uid, gid=gid)


def directory(name: str, mode: int = 0o755) -> Member:
    return Member(name, kind=tarfile.DIRTYPE, mode=mode)


def symlink(name: str, target: str) -> Member:
    return Member(name, kind=tarfile.SYMTYPE, link=target, mode=0o777)


def hardlink(name: str, target: str) -> Member:
    return Member(name, kind=tarfile.LNKTYPE, link=target)


def layer(*members: Member) -> bytes:
    """An uncompressed layer tar, written the way image builders write them (PAX, fixed times)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for m in members:
            info = tarfile.TarInfo(m.name)
            info.type, info.mode, info.uid, info.gid, info.mtime = m.kind, m.mode, m.uid, m.gid, MTIME
            info.linkname, info.size, info.pax_headers = m.link, len(m.data), m.pax
            tar.addfile(info, io.BytesIO(m.data) if m.kind == tarfile.REGTYPE else None)
    return out.getvalue()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def config_doc(layers: Sequence[bytes], diff_ids: Sequence[str] | None = None, **section: Any) -> bytes:
    """An image config; ``layers`` are the uncompressed tars whose digests become rootfs.diff_ids."""
    ids = list(diff_ids) if diff_ids is not None else [f"sha256:{sha(raw)}" for raw in layers]
    doc = {"architecture": HOST_ARCH, "os": "linux", "config": section, "rootfs": {"type": "layers", "diff_ids": ids}}
    return json.dumps(doc).encode()


def add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime = len(data), MTIME
    tar.addfile(info, io.BytesIO(data))


def docker_save(path: Path, blobs: Sequence[bytes], config: bytes, *, symlink_dupes: bool = False) -> Path:
    """A tarball in the classic `docker save` format: <id>/layer.tar, <id>.json, manifest.json."""
    with tarfile.open(path, "w:gz" if path.name.endswith(".gz") else "w") as tar:
        names: list[str] = []
        first: dict[bytes, str] = {}
        for i, blob in enumerate(blobs):
            name = f"{i:064x}/layer.tar"
            if symlink_dupes and blob in first:
                info = tarfile.TarInfo(name)
                info.type, info.linkname = tarfile.SYMTYPE, f"../{first[blob]}"
                tar.addfile(info)
            else:
                add(tar, name, blob)
                first.setdefault(blob, name)
            names.append(name)
        add(tar, f"{sha(config)}.json", config)
        manifest = [{"Config": f"{sha(config)}.json", "RepoTags": ["test:1"], "Layers": names}]
        add(tar, "manifest.json", json.dumps(manifest).encode())
    return path


def blob_put(blobs: dict[str, bytes], data: bytes) -> dict[str, Any]:
    blobs[sha(data)] = data
    return {"digest": f"sha256:{sha(data)}", "size": len(data)}


def manifest_doc(blobs: dict[str, bytes], layers: Sequence[tuple[bytes, str]], config: bytes) -> bytes:
    descs = [{**blob_put(blobs, data), "mediaType": media} for data, media in layers]
    doc = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {**blob_put(blobs, config), "mediaType": "application/vnd.oci.image.config.v1+json"},
        "layers": descs,
    }
    return json.dumps(doc).encode()


def docker25_save(path: Path, blobs_in: Sequence[bytes], config: bytes) -> Path:
    """A tarball the way Docker 25+ saves one: an OCI layout (blobs, index.json) plus manifest.json."""
    blobs: dict[str, bytes] = {}
    manifest = manifest_doc(blobs, [(b, OCI_LAYER) for b in blobs_in], config)
    index = {
        "schemaVersion": 2,
        "mediaType": OCI_INDEX,
        "manifests": [{**blob_put(blobs, manifest), "mediaType": OCI_MANIFEST}],
    }
    legacy = [
        {
            "Config": f"blobs/sha256/{sha(config)}",
            "RepoTags": ["test:1"],
            "Layers": [f"blobs/sha256/{sha(b)}" for b in blobs_in],
        }
    ]
    with tarfile.open(path, "w:gz" if path.name.endswith(".gz") else "w") as tar:
        for digest, data in blobs.items():
            add(tar, f"blobs/sha256/{digest}", data)
        add(tar, "oci-layout", b'{"imageLayoutVersion": "1.0.0"}')
        add(tar, "index.json", json.dumps(index).encode())
        add(tar, "manifest.json", json.dumps(legacy).encode())
    return path


def oci_layout(root: Path, index: dict[str, Any], blobs: dict[str, bytes]) -> Path:
    (root / "blobs" / "sha256").mkdir(parents=True)
    for digest, data in blobs.items():
        (root / "blobs" / "sha256" / digest).write_bytes(data)
    (root / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (root / "index.json").write_text(json.dumps(index))
    return root


def simple_image(tmp_path: Path, name: str, *layers: bytes, **section: Any) -> Path:
    return docker_save(tmp_path / f"{name}.tar", layers, config_doc(layers, **section))


def leftovers(cache: Path) -> list[Path]:
    return list((cache / "tmp").iterdir()) if (cache / "tmp").exists() else []


def cached_layers(cache: Path) -> list[str]:
    root = cache / "layers" / "sha256"
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


# ---------------------------------------------------------------------- formats


def test_docker_save_tarball_gives_layers_lowest_first_and_its_config(tmp_path: Path, cache: Path) -> None:
    base = layer(
        directory("etc"),
        file("etc/os-release", b"base\n"),
        directory("usr/bin"),
        file("usr/bin/tool", b"#!/bin/sh\n", mode=0o4755),
        hardlink("usr/bin/tool2", "usr/bin/tool"),
        symlink("usr/bin/sh", "/usr/bin/dash"),
        file("home/app/data", b"x", mode=0o600, uid=1000, gid=1001),
    )
    top = layer(file("etc/os-release", b"top\n"))
    section = {
        "Env": ["PATH=/usr/bin", "A=1"],
        "Entrypoint": ["/usr/bin/tool"],
        "Cmd": ["--serve", "8080"],
        "WorkingDir": "/srv",
        "User": "1000:1000",
    }
    # docker save stores a repeated layer once and links the second name to it
    image = docker_save(
        tmp_path / "app.tar", [base, top, base], config_doc([base, top, base], **section), symlink_dupes=True
    )

    resolved = ImageStore(cache).resolve(str(image))

    assert resolved.ref == str(image)
    assert [p.name for p in resolved.layers] == [sha(base), sha(top), sha(base)]
    assert all(p.parent == cache / "layers" / "sha256" for p in resolved.layers)
    assert (resolved.layers[0] / "etc/os-release").read_text() == "base\n"
    assert (resolved.layers[1] / "etc/os-release").read_text() == "top\n"
    assert resolved.config == ImageConfig(
        env=("PATH=/usr/bin", "A=1"),
        entrypoint=("/usr/bin/tool",),
        cmd=("--serve", "8080"),
        workdir="/srv",
        user="1000:1000",
    )
    assert resolved.binds == ()
    bin_dir = resolved.layers[0] / "usr/bin"
    assert stat.S_IMODE(os.stat(bin_dir / "tool").st_mode) == 0o4755
    assert os.stat(bin_dir / "tool").st_ino == os.stat(bin_dir / "tool2").st_ino
    assert os.readlink(bin_dir / "sh") == "/usr/bin/dash"
    data = os.stat(resolved.layers[0] / "home/app/data")
    assert (data.st_uid, data.st_gid, stat.S_IMODE(data.st_mode)) == (1000, 1001, 0o600)
    assert leftovers(cache) == []


@pytest.mark.parametrize("name", ["docker25.tar", "docker25.tar.gz"])
def test_docker25_tarball_with_oci_layout_inside(tmp_path: Path, cache: Path, name: str) -> None:
    base = layer(file("a", b"1"))
    top = layer(file("b", b"2"))
    image = docker25_save(tmp_path / name, [base, top], config_doc([base, top], Cmd=["run"]))

    resolved = ImageStore(cache).resolve(str(image))

    assert [p.name for p in resolved.layers] == [sha(base), sha(top)]
    assert (resolved.layers[1] / "b").read_bytes() == b"2"
    assert resolved.config == ImageConfig(cmd=("run",))


def test_oci_tarball_without_manifest_json(tmp_path: Path, cache: Path) -> None:
    raw = layer(file("only", b"oci"))
    blobs: dict[str, bytes] = {}
    manifest = manifest_doc(blobs, [(gzip.compress(raw), OCI_LAYER + "+gzip")], config_doc([raw]))
    index = {"schemaVersion": 2, "manifests": [{**blob_put(blobs, manifest), "mediaType": OCI_MANIFEST}]}
    layout = oci_layout(tmp_path / "layout", index, blobs)
    archive = tmp_path / "oci.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(layout, arcname=".")

    resolved = ImageStore(cache).resolve(str(archive))

    assert (resolved.layers[0] / "only").read_bytes() == b"oci"


@pytest.mark.parametrize("nested", [False, True], ids=["index", "nested-index"])
def test_oci_layout_picks_this_machines_platform(tmp_path: Path, cache: Path, nested: bool) -> None:
    blobs: dict[str, bytes] = {}
    platforms = []
    for arch in (OTHER_ARCH, HOST_ARCH):
        base = layer(file("arch", arch.encode()))
        top = layer(directory("etc"), file("etc/top", b"top"))
        layers = [(gzip.compress(base), OCI_LAYER + "+gzip"), (gzip.compress(top), OCI_LAYER + "+gzip")]
        manifest = manifest_doc(blobs, layers, config_doc([base, top], Env=[f"ARCH={arch}"]))
        platforms.append(
            {**blob_put(blobs, manifest), "mediaType": OCI_MANIFEST, "platform": {"os": "linux", "architecture": arch}}
        )
    index: dict[str, Any] = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": platforms}
    if nested:
        inner = json.dumps(index).encode()
        index = {"schemaVersion": 2, "manifests": [{**blob_put(blobs, inner), "mediaType": OCI_INDEX}]}
    layout = oci_layout(tmp_path / "layout", index, blobs)

    resolved = ImageStore(cache).resolve(str(layout))

    assert resolved.config.env == (f"ARCH={HOST_ARCH}",)
    assert (resolved.layers[0] / "arch").read_text() == HOST_ARCH
    assert (resolved.layers[1] / "etc/top").read_text() == "top"
    assert len(resolved.layers) == 2


def test_oci_layout_without_this_platform_is_an_error(tmp_path: Path, cache: Path) -> None:
    blobs: dict[str, bytes] = {}
    raw = layer(file("x"))
    descs = [
        {
            **blob_put(blobs, manifest_doc(blobs, [(raw, OCI_LAYER)], config_doc([raw], Env=[arch]))),
            "platform": {"os": "linux", "architecture": arch},
        }
        for arch in (OTHER_ARCH, "riscv64")
    ]
    layout = oci_layout(tmp_path / "layout", {"schemaVersion": 2, "manifests": descs}, blobs)

    with pytest.raises(ImageError, match=f"none for linux/{HOST_ARCH}.*riscv64"):
        ImageStore(cache).resolve(str(layout))


def test_plain_root_filesystem_directory_is_one_layer_used_in_place(tmp_path: Path, cache: Path) -> None:
    rootfs = tmp_path / "rootfs"
    (rootfs / "bin").mkdir(parents=True)
    (rootfs / "bin" / "sh").write_text("shell")

    resolved = ImageStore(cache).resolve(str(rootfs))

    assert resolved.layers == (rootfs.resolve(),)
    assert resolved.config == ImageConfig()
    assert cached_layers(cache) == []


def test_config_without_diff_ids_keys_layers_by_their_content(tmp_path: Path, cache: Path) -> None:
    raw = layer(file("f", b"content"))
    config = json.dumps({"config": {"Cmd": ["x"]}}).encode()
    image = docker_save(tmp_path / "noids.tar", [gzip.compress(raw)], config)

    resolved = ImageStore(cache).resolve(str(image))

    assert [p.name for p in resolved.layers] == [sha(raw)]  # the uncompressed stream's digest, not the gzip's


# ---------------------------------------------------------------------- whiteouts, through the kernel


def test_whiteouts_and_opaque_dirs_hide_lower_files_in_a_real_overlay(tmp_path: Path, cache: Path) -> None:
    lower = layer(
        file("keep.txt", b"kept"),
        file("gone.txt", b"doomed"),
        directory("dir"),
        file("dir/old.txt", b"old"),
        file("dir/sub/deep.txt", b"deep"),
        directory("gonedir"),
        file("gonedir/inner", b"i"),
    )
    upper = layer(file(".wh.gone.txt"), file("dir/.wh..wh..opq"), file("dir/new.txt", b"new"), file(".wh.gonedir"))
    image = simple_image(tmp_path, "wh", lower, upper)
    resolved = ImageStore(cache).resolve(str(image))
    top = resolved.layers[1]
    for name in ("gone.txt", "gonedir"):
        st = os.lstat(top / name)
        assert stat.S_ISCHR(st.st_mode)
        assert st.st_rdev == os.makedev(0, 0)
    assert os.getxattr(top / "dir", "trusted.overlay.opaque") == b"y"
    assert not list(top.glob("**/.wh.*"))

    target, upperdir, workdir = tmp_path / "mnt", tmp_path / "upper", tmp_path / "work"
    for d in (target, upperdir, workdir):
        d.mkdir()
    lowerdir = ":".join(str(p) for p in reversed(resolved.layers))  # overlayfs: topmost first
    subprocess.run(
        [
            "mount",
            "-t",
            "overlay",
            "overlay",
            "-o",
            f"lowerdir={lowerdir},upperdir={upperdir},workdir={workdir}",
            str(target),
        ],
        check=True,
        capture_output=True,
    )
    try:
        assert (target / "keep.txt").read_bytes() == b"kept"
        assert not (target / "gone.txt").exists()
        assert not (target / "gonedir").exists()
        assert sorted(os.listdir(target / "dir")) == ["new.txt"]
        assert sorted(os.listdir(target)) == ["dir", "keep.txt"]
    finally:
        subprocess.run(["umount", str(target)], check=True)


# ---------------------------------------------------------------------- the cache


def test_second_resolve_reuses_the_unpacked_layers(tmp_path: Path, cache: Path) -> None:
    base, top = layer(file("a", b"a")), layer(file("b", b"b"))
    image = simple_image(tmp_path, "app", base, top)
    first_store = ImageStore(cache)
    first = first_store.resolve(str(image))
    inodes = [os.stat(p).st_ino for p in first.layers]
    assert first_store.layers_unpacked == 2

    again = ImageStore(cache)
    second = again.resolve(str(image))
    assert second == first
    assert [os.stat(p).st_ino for p in second.layers] == inodes
    assert again.layers_unpacked == 0

    # A touched tarball is read again, but its layers are found by diff id, not unpacked again.
    os.utime(image, ns=(MTIME * 10**9, MTIME * 10**9))
    assert again.resolve(str(image)).layers == first.layers
    assert again.layers_unpacked == 0


def test_unchanged_tarball_is_not_read_again(tmp_path: Path, cache: Path) -> None:
    raw = layer(file("a", b"a"))
    image = simple_image(tmp_path, "app", raw, Cmd=["go"])
    first = ImageStore(cache).resolve(str(image))

    # Same size, same mtime, same inode, garbage inside: only the cached resolution can answer.
    st = image.stat()
    with open(image, "r+b") as f:
        f.write(b"\0" * st.st_size)
    os.utime(image, ns=(st.st_atime_ns, st.st_mtime_ns))

    assert ImageStore(cache).resolve(str(image)) == first


def test_images_sharing_a_layer_share_its_directory(tmp_path: Path, cache: Path) -> None:
    base = layer(directory("usr"), file("usr/shared", b"s"))
    one = simple_image(tmp_path, "one", base, layer(file("one")))
    two = simple_image(tmp_path, "two", base, layer(file("two")))
    store = ImageStore(cache)

    a, b = store.resolve(str(one)), store.resolve(str(two))

    assert a.layers[0] == b.layers[0]
    assert a.layers[1] != b.layers[1]
    assert store.layers_unpacked == 3
    assert len(cached_layers(cache)) == 3


def test_processes_resolving_at_once_unpack_each_layer_once(tmp_path: Path, cache: Path) -> None:
    layers = [layer(file(f"f{i}", os.urandom(1 << 16))) for i in range(2)]
    image = simple_image(tmp_path, "app", *layers)
    script = (
        "import json, sys\n"
        "from pathlib import Path\n"
        "from levers9.engine.images import ImageStore\n"
        "store = ImageStore(Path(sys.argv[1]))\n"
        "image = store.resolve(sys.argv[2])\n"
        "print(json.dumps({'layers': [str(p) for p in image.layers], 'unpacked': store.layers_unpacked}))\n"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", script, str(cache), str(image)], stdout=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0
        results.append(json.loads(out))

    assert {tuple(r["layers"]) for r in results} == {tuple(str(cache / "layers/sha256" / sha(raw)) for raw in layers)}
    assert sum(r["unpacked"] for r in results) == 2
    assert leftovers(cache) == []


# ---------------------------------------------------------------------- refusals


def test_diff_id_mismatch_is_refused_and_leaves_nothing(tmp_path: Path, cache: Path) -> None:
    raw = layer(file("a", b"a"))
    image = docker_save(tmp_path / "bad.tar", [raw], config_doc([raw], diff_ids=[f"sha256:{'0' * 64}"]))

    with pytest.raises(ImageError, match=r"bad\.tar.*diff_ids"):
        ImageStore(cache).resolve(str(image))
    assert cached_layers(cache) == []
    assert leftovers(cache) == []


@pytest.mark.parametrize(
    "members",
    [
        pytest.param([file("../evil", b"x")], id="dotdot"),
        pytest.param([file("ok/../../evil", b"x")], id="dotdot-inside"),
        pytest.param([file("{outside}/evil", b"x")], id="absolute"),
        pytest.param([symlink("link", "{outside}"), file("link/evil", b"x")], id="symlink-then-write"),
        pytest.param(
            [symlink("link", "../../../../../../../../{outside}"), file("link/evil", b"x")], id="relative-symlink"
        ),
        pytest.param([hardlink("evil", "../../outside/victim")], id="hardlink-out"),
        pytest.param([symlink("link", "{outside}"), hardlink("evil", "link/victim")], id="hardlink-through-symlink"),
    ],
)
def test_layers_cannot_write_outside_themselves(tmp_path: Path, cache: Path, members: list[Member]) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_text("mine")
    for m in members:
        m.name = m.name.format(outside=outside)
        m.link = m.link.format(outside=str(outside).lstrip("/") if m.link.startswith("../") else outside)
    image = simple_image(tmp_path, "evil", layer(*members))

    with pytest.raises(ImageError, match=r"evil\.tar.*refused"):
        ImageStore(cache).resolve(str(image))
    assert sorted(os.listdir(outside)) == ["victim"]
    assert (outside / "victim").read_text() == "mine"
    assert not (tmp_path / "evil").exists()
    assert cached_layers(cache) == []
    assert leftovers(cache) == []


def test_zstd_layer_media_type_is_refused(tmp_path: Path, cache: Path) -> None:
    raw = layer(file("a"))
    blobs: dict[str, bytes] = {}
    manifest = manifest_doc(blobs, [(raw, OCI_LAYER + "+zstd")], config_doc([raw]))
    layout = oci_layout(tmp_path / "layout", {"schemaVersion": 2, "manifests": [blob_put(blobs, manifest)]}, blobs)

    with pytest.raises(ImageError, match=r"zstd.*not supported"):
        ImageStore(cache).resolve(str(layout))


def test_zstd_layer_content_is_refused(tmp_path: Path, cache: Path) -> None:
    fake_zstd = b"\x28\xb5\x2f\xfd" + b"\0" * 64  # the magic is enough: it is refused before decoding
    image = docker_save(tmp_path / "z.tar", [fake_zstd], config_doc([fake_zstd]))

    with pytest.raises(ImageError, match=r"z\.tar.*zstd"):
        ImageStore(cache).resolve(str(image))
    assert leftovers(cache) == []


def test_registry_name_explains_there_is_no_registry(cache: Path) -> None:
    with pytest.raises(ImageError) as raised:
        ImageStore(cache).resolve("python:3.11")
    message = str(raised.value)
    assert "'python:3.11'" in message
    assert "no registry" in message
    assert "docker save python:3.11" in message
    assert "OCI image layout directory" in message


def test_missing_path_lists_the_accepted_forms(tmp_path: Path, cache: Path) -> None:
    with pytest.raises(ImageError) as raised:
        ImageStore(cache).resolve(str(tmp_path / "missing.tar"))
    message = str(raised.value)
    assert "no such file" in message
    assert "registry" not in message
    assert "docker save" in message
    assert "`host`" in message


def test_file_that_is_not_a_tarball(tmp_path: Path, cache: Path) -> None:
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"not a tar at all" * 100)
    with pytest.raises(ImageError, match="not a tar archive"):
        ImageStore(cache).resolve(str(junk))


# ---------------------------------------------------------------------- the host image


def test_host_image_is_a_skeleton_plus_read_only_binds(cache: Path) -> None:
    store = ImageStore(cache)
    image = store.resolve("host")

    assert image.ref == "host"
    assert len(image.layers) == 1
    root = image.layers[0]
    assert image.binds[0] == HostBind(source="/usr", target="/usr")
    assert image.config == ImageConfig(
        env=("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",), workdir="/"
    )
    for name in ("proc", "sys", "dev", "tmp", "etc", "root", "run", "var/tmp", "home", "usr"):
        assert (root / name).is_dir(), name
    assert stat.S_IMODE(os.stat(root / "tmp").st_mode) == 0o1777
    passwd = (root / "etc/passwd").read_text().splitlines()
    assert [line.split(":")[0] for line in passwd] == ["root", "nobody"]
    assert (root / "etc/group").read_text().startswith("root:x:0:")
    assert "localhost" in (root / "etc/hosts").read_text()
    if Path("/etc/resolv.conf").exists():
        assert (root / "etc/resolv.conf").read_text() == Path("/etc/resolv.conf").read_text()
    for name in ("bin", "lib", "lib64", "sbin"):
        host = Path("/") / name
        if host.is_symlink():
            assert os.readlink(root / name) == os.readlink(host)
        elif host.is_dir():
            assert HostBind(source=str(host), target=f"/{name}") in image.binds
    for prefix in {sys.prefix, sys.base_prefix}:
        if not prefix.startswith("/usr/"):
            assert any(prefix == b.target or prefix.startswith(b.target + "/") for b in image.binds), prefix
            assert any((root / b.target.lstrip("/")).is_dir() for b in image.binds if prefix.startswith(b.target))
    assert all(b.source == b.target for b in image.binds)

    assert store.resolve("host") == image  # built once, then found
    assert sorted(os.listdir(cache / "host")) == [root.name]


def test_host_layout_of_merged_and_unmerged_roots(tmp_path: Path) -> None:
    merged = tmp_path / "merged"
    for name in ("usr/bin", "usr/lib", "usr/sbin"):
        (merged / name).mkdir(parents=True)
    for name in ("bin", "lib", "sbin"):
        (merged / name).symlink_to(f"usr/{name}")
    links, binds = host_layout(merged)
    assert links == {"bin": "usr/bin", "lib": "usr/lib", "sbin": "usr/sbin"}
    assert binds == [HostBind(source=str(merged / "usr"), target="/usr")]

    old = tmp_path / "old"
    for name in ("usr", "bin", "lib", "lib64", "sbin"):
        (old / name).mkdir(parents=True)
    links, binds = host_layout(old)
    assert links == {}
    assert [b.target for b in binds] == ["/usr", "/bin", "/lib", "/lib64", "/sbin"]
    assert binds[1] == HostBind(source=str(old / "bin"), target="/bin")


def tree(root: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(root)), os.lstat(p).st_mode) for p in root.rglob("*"))


@pytest.fixture
def runc_bundle(tmp_path: Path) -> tuple[str, Path, Path]:
    """The runc binary, a bundle made by `runc spec` and a private state root, so parallel tests never meet."""
    runc = shutil.which("runc")
    if runc is None:
        pytest.fail("runc is not installed (looked on PATH): the host image must be proven to run under runc")
    bundle, state = tmp_path / "bundle", tmp_path / "runc"
    bundle.mkdir()
    subprocess.run([runc, "spec"], cwd=bundle, check=True, capture_output=True)
    return runc, bundle, state


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        pytest.param(["/usr/bin/python3", "-c", "print(42)"], "42", id="system-python"),
        pytest.param([sys.executable, "-c", "import sys; print(sys.prefix)"], sys.prefix, id="this-venv"),
    ],
)
def test_host_image_runs_python_under_runc(
    cache: Path, runc_bundle: tuple[str, Path, Path], argv: list[str], expected: str
) -> None:
    runc, bundle, state = runc_bundle
    image = ImageStore(cache).resolve("host")
    skeleton = image.layers[0]
    before = tree(skeleton)
    spec = json.loads((bundle / "config.json").read_text())
    spec["process"].update(terminal=False, args=argv, env=list(image.config.env), cwd=image.config.workdir)
    spec["root"] = {"path": str(skeleton), "readonly": True}
    spec["mounts"] += [
        {"destination": b.target, "type": "bind", "source": b.source, "options": ["rbind", "ro"]} for b in image.binds
    ]
    (bundle / "config.json").write_text(json.dumps(spec))
    container = f"images-test-{uuid.uuid4().hex[:12]}"
    try:
        proc = subprocess.run(
            [runc, "--root", str(state), "run", "--bundle", str(bundle), container],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        subprocess.run([runc, "--root", str(state), "delete", "--force", container], capture_output=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == expected
    assert tree(skeleton) == before  # the shared layer stays untouched by a container using it
