"""The private dockerd and the tiny image the agent's tests run on."""

from __future__ import annotations

from tests.fixtures.dockerd import Dockerd


def test_a_container_of_the_tiny_image_runs_on_the_private_daemon(dockerd: Dockerd, tiny_image: str) -> None:
    done = dockerd.cli("run", "--rm", "--network", "host", tiny_image, "/bin/sh", "-c", "echo from-the-box")
    assert done.stdout.strip() == "from-the-box"
    assert dockerd.containers() == []
