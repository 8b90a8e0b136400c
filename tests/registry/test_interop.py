"""What levers9 pushes, other tools read, and what they push, levers9 pulls: skopeo and a private dockerd.

The image pushed here is made in the test: one layer with the host's ``dash``
(as ``/bin/sh``), ``cat`` and ``echo`` and the libraries ``ldd`` names for them
(there is no busybox on this machine), and a file to print. Docker pulls it
from ``127.0.0.1:PORT`` over plain HTTP (Docker treats 127.0.0.0/8 registries
as insecure by default) and runs it; skopeo inspects it and copies it to an
OCI layout directory, which the image store then resolves.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from levers9.engine.images import ImageStore
from levers9.registry.client import DOCKER_MANIFEST, RegistryClient, push_image
from levers9.registry.pull import RegistryPuller
from tests.fixtures.dockerd import Dockerd
from tests.fixtures.registry import Layer, Registry, image_config, make_layer, shell_layer

GREETING = b"hello from the levers9 registry client\n"


def _push_shell_image(registry: Registry, tmp_path: Path, repo: str) -> tuple[str, list[Layer]]:
    layers = [
        shell_layer(tmp_path / "shell.tar.gz"),
        make_layer(tmp_path / "greeting.tar.gz", {"etc/greeting": GREETING}),
    ]
    config = image_config(layers, cmd=["/bin/sh", "-c", "cat /etc/greeting"])
    with RegistryClient(registry.url) as client:
        digest = push_image(client, repo, "v1", [layer.spec() for layer in layers], config)
    return digest, layers


def _skopeo(*args: str) -> subprocess.CompletedProcess[str]:
    if shutil.which("skopeo") is None:
        pytest.fail("these tests need skopeo: apt-get install -y skopeo")
    done = subprocess.run(["skopeo", *args], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"skopeo {' '.join(args)} failed: {done.stderr}"
    return done


def test_skopeo_reads_a_pushed_image_and_copies_it_to_a_layout_the_store_resolves(
    registry: Registry, tmp_path: Path
) -> None:
    digest, layers = _push_shell_image(registry, tmp_path, "tests/skopeo")
    ref = f"docker://{registry.address}/tests/skopeo:v1"

    inspected = json.loads(_skopeo("inspect", "--tls-verify=false", ref).stdout)
    assert inspected["Digest"] == digest
    assert inspected["Layers"] == [layer.digest for layer in layers]
    assert inspected["Os"] == "linux"

    raw = json.loads(_skopeo("inspect", "--tls-verify=false", "--raw", ref).stdout)
    assert raw["mediaType"] == "application/vnd.oci.image.manifest.v1+json"

    layout = tmp_path / "layout"
    _skopeo("copy", "--src-tls-verify=false", ref, f"oci:{layout}:v1")
    image = ImageStore(tmp_path / "cache").resolve(str(layout))
    assert (image.layers[1] / "etc/greeting").read_bytes() == GREETING
    assert image.config.cmd == ("/bin/sh", "-c", "cat /etc/greeting")


def test_docker_pulls_and_runs_a_pushed_image(registry: Registry, dockerd: Dockerd, tmp_path: Path) -> None:
    digest, _ = _push_shell_image(registry, tmp_path, "tests/docker")
    name = f"{registry.address}/tests/docker"
    dockerd.cli("pull", f"{name}:v1", timeout=120)
    try:
        repo_digests = json.loads(dockerd.cli("image", "inspect", f"{name}:v1").stdout)[0]["RepoDigests"]
        assert f"{name}@{digest}" in repo_digests
        ran = dockerd.cli("run", "--rm", "--network", "none", f"{name}:v1", timeout=60)
        assert ran.stdout.encode() == GREETING
    finally:
        dockerd.cli("image", "rm", "-f", f"{name}:v1", check=False)


def test_an_image_docker_pushed_is_pulled_into_the_store(
    registry: Registry, dockerd: Dockerd, tiny_image: str, tmp_path: Path
) -> None:
    name = f"{registry.address}/tests/from-docker:v1"
    dockerd.cli("tag", tiny_image, name)
    try:
        dockerd.cli("push", name, timeout=120)
    finally:
        dockerd.cli("image", "rm", name, check=False)
    with RegistryClient(registry.url) as client:
        _, media_type, digest = client.get_manifest("tests/from-docker", "v1")
    assert media_type == DOCKER_MANIFEST  # docker's own format, gzip layers of docker's media type

    with RegistryPuller() as puller:
        store = ImageStore(tmp_path / "cache", puller=puller)
        image = store.resolve(f"{registry.address}/tests/from-docker@{digest}")
        assert (image.layers[-1] / "bin/sh").is_file()
        assert puller.layers_downloaded == len(image.layers)
