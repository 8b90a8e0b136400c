"""A container starts in its spec's directory, or, where the spec leaves the default, in its image's WorkingDir
(a blueprint's WORKDIR, a Dockerfile's), and its Python path keeps the image's after its own."""

from __future__ import annotations

import pytest

from levers9.engine.spec import oci_config
from levers9.hooks.types import ContainerSpec


@pytest.mark.parametrize(
    ("spec_workdir", "image_workdir", "cwd"),
    [("/", "/srv/app", "/srv/app"), ("/work", "/srv/app", "/work"), ("/", None, "/"), ("/work", None, "/work")],
)
def test_the_images_working_directory_applies_where_the_spec_leaves_the_default(
    spec_workdir: str, image_workdir: str | None, cwd: str
) -> None:
    spec = ContainerSpec(container_id="c1", image="host", command=["true"], workdir=spec_workdir)
    config = oci_config(spec, rootfs="/nonexistent/rootfs", image_workdir=image_workdir)
    assert config["process"]["cwd"] == cwd


def test_the_images_python_path_is_kept_after_the_specs() -> None:
    spec = ContainerSpec(container_id="c1", image="host", command=["true"], env={"PYTHONPATH": "/levers9/python"})
    config = oci_config(spec, rootfs="/nonexistent/rootfs", image_env=["PYTHONPATH=/app", "MODE=fast"])
    env = dict(item.split("=", 1) for item in config["process"]["env"])
    assert (env["PYTHONPATH"], env["MODE"]) == ("/levers9/python:/app", "fast")
    alone = oci_config(spec, rootfs="/nonexistent/rootfs")
    assert dict(item.split("=", 1) for item in alone["process"]["env"])["PYTHONPATH"] == "/levers9/python"
