"""A container starts in its spec's directory, or, where the spec leaves the default, in its image's WorkingDir
(a blueprint's WORKDIR, a Dockerfile's): the rule of the OCI config the engine writes."""

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
