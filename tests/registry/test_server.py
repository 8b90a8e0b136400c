"""The embedded registry: a real docker-registry child started, stopped and restarted; nothing left running."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from levers9.registry.client import RegistryClient, push_image
from levers9.registry.errors import RegistryError
from levers9.registry.server import EmbeddedRegistry
from levers9.registry.supervisor import RegistrySupervisor
from tests.fixtures.registry import image_config, make_layer
from tests.fixtures.wait import wait_for


def _gone(pid: int) -> bool:
    """No such process, or only a zombie another parent has not reaped yet."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state == "Z"


def _push(url: str, tmp_path: Path) -> str:
    layer = make_layer(tmp_path / "layer.tar.gz", {"etc/kept": b"kept across restarts\n"})
    with RegistryClient(url) as client:
        return push_image(client, "tests/embedded", "v1", [layer.spec()], image_config([layer]))


def test_start_serves_images_and_stop_leaves_no_process(tmp_path: Path) -> None:
    registry = EmbeddedRegistry(tmp_path / "registry")
    registry.start()
    try:
        assert registry.alive()
        assert registry.address == f"127.0.0.1:{registry.port}"
        config = yaml.safe_load((tmp_path / f"registry/config-{registry.port}.yml").read_text())
        assert config["http"]["addr"] == registry.address
        assert config["storage"]["filesystem"]["rootdirectory"] == str(tmp_path / "registry/storage")
        assert config["storage"]["delete"] == {"enabled": True}
        assert config["log"]["level"] == "warn"
        digest = _push(registry.url, tmp_path)
        with RegistryClient(registry.url) as client:
            assert client.get_manifest("tests/embedded", "v1")[2] == digest
            client.delete_manifest("tests/embedded", digest)  # deletes are enabled
        assert (tmp_path / "registry/storage/docker/registry/v2").is_dir()
    finally:
        registry.stop()
    assert registry.process is not None
    pid = registry.process.pid
    assert not registry.alive()
    assert registry.process.returncode is not None  # reaped by stop(): no zombie
    assert _gone(pid)
    registry.stop()  # a second stop is a no-op


def test_a_taken_port_and_a_missing_binary_are_clear_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(RegistryError, match=f"port {port} on 127.0.0.1 is taken by another process"):
            EmbeddedRegistry(tmp_path / "a", port=port).start()

    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(RegistryError, match="apt-get install -y docker-registry") as missing:
        EmbeddedRegistry(tmp_path / "b").start()
    assert missing.value.operation == "start the embedded registry"


def test_the_registry_dies_with_its_parent(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from levers9.registry.server import EmbeddedRegistry
        registry = EmbeddedRegistry(Path({str(tmp_path / "registry")!r}))
        registry.start()
        print(registry.process.pid, flush=True)
        time.sleep(600)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert not _gone(child)
    finally:
        parent.kill()
        parent.wait()
    wait_for(lambda: _gone(child), "the registry to exit after its parent was killed")


async def test_the_supervisor_restarts_a_killed_registry_on_the_same_port_with_its_images(tmp_path: Path) -> None:
    registry = EmbeddedRegistry(tmp_path / "registry")
    registry.start()
    restarted: list[int] = []
    supervisor = RegistrySupervisor(registry, on_restart=lambda: restarted.append(1))
    supervisor.start()
    try:
        digest = _push(registry.url, tmp_path)
        assert registry.process is not None
        first = registry.process.pid
        port = registry.port
        os.kill(first, signal.SIGKILL)

        async def restarted_once() -> None:
            while not (supervisor.restarts == 1 and registry.alive()):
                await asyncio.sleep(0.05)

        await asyncio.wait_for(restarted_once(), 30)
        assert registry.process.pid != first
        assert _gone(first)  # reaped by the supervisor
        assert registry.port == port
        assert restarted == [1]
        with RegistryClient(registry.url) as client:
            assert client.get_manifest("tests/embedded", "v1")[2] == digest
    finally:
        await supervisor.close()
        registry.stop()
    assert not registry.alive()
    assert _gone(registry.process.pid)


async def test_the_supervisor_gives_up_when_no_start_succeeds(tmp_path: Path) -> None:
    wrapper = tmp_path / "docker-registry"  # a binary that can be taken away while the registry runs
    wrapper.write_text(f'#!/bin/sh\nexec {shutil.which("docker-registry")} "$@"\n')
    wrapper.chmod(0o755)
    registry = EmbeddedRegistry(tmp_path / "registry", binary=str(wrapper))
    registry.start()
    supervisor = RegistrySupervisor(registry, tries=2)
    supervisor.start()
    try:
        assert registry.process is not None
        wrapper.unlink()
        registry.process.kill()
        await asyncio.wait_for(supervisor.failed.wait(), 30)
        assert supervisor.failure is not None
        assert "could not be started again (2 tries)" in str(supervisor.failure)
        assert "apt-get install -y docker-registry" in str(supervisor.failure)
        assert supervisor.restarts == 0
    finally:
        await supervisor.close()
        registry.stop()
    assert not registry.alive()
    assert _gone(registry.process.pid)


def test_two_registries_sharing_a_data_directory_each_serve_on_their_own_port(tmp_path: Path) -> None:
    """Two replicas on one data directory both start an embedded registry, at the same moment: each must bind its
    own port (a shared config file once sent both to one port; the full suite met it as a 30 s start timeout)."""
    from concurrent.futures import ThreadPoolExecutor

    registries = [EmbeddedRegistry(tmp_path / "registry"), EmbeddedRegistry(tmp_path / "registry")]
    # the threads that start them live on until the end: a registry gets SIGTERM when its starting thread ends
    with ThreadPoolExecutor(2) as pool:
        try:
            for started in [pool.submit(r.start) for r in registries]:
                started.result(120)
            assert registries[0].port != registries[1].port
            for registry in registries:
                with RegistryClient(registry.url) as client:
                    client.check()
        finally:
            for registry in registries:
                registry.stop()
