"""The emulated boot: what it runs, where, with what environment and network, and that it leaves nothing behind."""

from __future__ import annotations

import base64
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from levers9.testing.boot import BootError, EmulatedBoot, emulated_boot, prepare


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="l9boot-test-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)  # EmulatedBoot.stop() removes it; prepare() alone does not


def live(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except OSError:
        return False


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} within {timeout:g} s")
        time.sleep(0.05)


def finished(boot: EmulatedBoot) -> Callable[[], bool]:
    return lambda: boot.process.poll() is not None


# --------------------------------------------------------------------------- user data formats


def test_cloud_config_files_land_under_root_and_runcmd_finds_them(root: Path) -> None:
    user_data = """#cloud-config
write_files:
  - path: /etc/levers9/hello.sh
    owner: root:root
    permissions: "0700"
    content: |
      #!/bin/sh
      echo "hello from $0" > "$LEVERS9_BOOT_ROOT/out"
  - path: /etc/levers9/data
    encoding: b64
    content: {}
runcmd:
  - [/etc/levers9/hello.sh]
  - cat /etc/levers9/data >> "$LEVERS9_BOOT_ROOT/out"
""".format(base64.b64encode(b"bytes\n").decode())
    command = prepare(user_data, root)
    script = root / "etc" / "levers9" / "hello.sh"
    assert script.stat().st_mode & 0o777 == 0o700
    assert (root / "etc" / "levers9" / "data").read_bytes() == b"bytes\n"
    assert command[0] == "/bin/sh"
    runcmd = Path(command[1]).read_text()
    assert str(script) in runcmd
    assert f"cat {root}/etc/levers9/data" in runcmd


def test_a_script_runs_as_it_is(root: Path) -> None:
    boot = emulated_boot('#!/bin/sh\necho "$HOME $LEVERS9_BOOT_ROOT" > "$LEVERS9_BOOT_ROOT/out"\n', root)
    try:
        wait_for(finished(boot), "the script finished")
        assert (root / "out").read_text().split() == [str(root), str(root)]
    finally:
        boot.stop()
    assert not root.exists()


@pytest.mark.parametrize(
    ("user_data", "message"),
    [
        ("#cloud-config\npackages: [curl]\nruncmd: [[true]]\n", "uses packages; the emulated boot runs only"),
        ("#cloud-config\nwrite_files:\n  - path: /x\n    source: {uri: http://x}\n", "has source"),
        ("#cloud-config\nwrite_files:\n  - path: /x\n    encoding: gz\n", "encoding 'gz'"),
        ("Content-Type: multipart/mixed\n", "neither a '#!' script nor '#cloud-config'"),
        ("", "neither a '#!' script nor '#cloud-config'"),
    ],
)
def test_what_a_boot_cannot_run_is_refused(root: Path, user_data: str, message: str) -> None:
    with pytest.raises(BootError) as caught:
        prepare(user_data, root)
    assert message in str(caught.value)


# --------------------------------------------------------------------------- environment, processes


def test_the_environment_is_clean_and_finds_this_levers9(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEVERS9_TEST_SECRET", "must-not-leak")
    boot = emulated_boot('#!/bin/sh\nenv > "$LEVERS9_BOOT_ROOT/env"\ncommand -v levers9 >> "$HOME/env"\n', root)
    try:
        wait_for(finished(boot), "the script finished")
        lines = (root / "env").read_text().splitlines()
    finally:
        boot.stop()
    env = dict(line.split("=", 1) for line in lines if "=" in line)
    assert "LEVERS9_TEST_SECRET" not in env
    assert env["PATH"].split(":")[0] == str(Path(sys.executable).parent)
    assert env["HOME"] == str(root)
    assert lines[-1] == str(Path(sys.executable).parent / "levers9")


def test_stop_ends_every_process_of_the_boot_even_one_that_left_the_group(root: Path) -> None:
    script = (
        "#!/bin/sh\n"
        "setsid sh -c 'echo $$ > \"$LEVERS9_BOOT_ROOT/escaped\"; exec sleep 600' &\n"
        'trap "" TERM\n'  # the boot script itself ignores SIGTERM: only SIGKILL ends it
        "while true; do sleep 1; done\n"
    )
    boot = emulated_boot(script, root)
    wait_for(lambda: (root / "escaped").exists() and bool((root / "escaped").read_text().strip()), "escaped")
    escaped = int((root / "escaped").read_text())
    assert escaped in boot.pids()
    assert boot.alive()
    boot.stop(grace=0.5)
    assert not boot.alive()
    assert not live(escaped)
    assert not root.exists()


# --------------------------------------------------------------------------- network


class Listener:
    """A TCP server on the host's 127.0.0.1 that answers every connection with ``name``."""

    def __init__(self, name: bytes) -> None:
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.port = self.socket.getsockname()[1]
        threading.Thread(target=self._serve, args=(name,), daemon=True).start()

    def _serve(self, name: bytes) -> None:
        while True:
            try:
                conn, _ = self.socket.accept()
            except OSError:
                return
            conn.sendall(name)
            conn.close()


PROBE = """#!{python}
import os, socket
root = os.environ["LEVERS9_BOOT_ROOT"]
for name, port in (("forwarded", {forwarded}), ("other", {other})):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=3) as conn:
            answer = conn.recv(100).decode()
    except OSError as exc:
        answer = "unreachable"
    open(os.path.join(root, name), "w").write(answer)
"""


def test_only_the_forwarded_port_is_reachable_in_the_network_namespace(root: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("a network namespace needs root here; the boot runs in a process group only")
    forwarded, other = Listener(b"controlplane"), Listener(b"elsewhere")
    try:
        script = PROBE.format(python=sys.executable, forwarded=forwarded.port, other=other.port)
        boot = emulated_boot(script, root, ports=[forwarded.port], isolate=True)
        try:
            assert boot.isolation.startswith("network namespace")
            wait_for(finished(boot), "the probe finished")
            assert (root / "forwarded").read_text() == "controlplane"
            assert (root / "other").read_text() == "unreachable"
        finally:
            boot.stop()
    finally:
        forwarded.socket.close()
        other.socket.close()


def test_without_isolation_the_host_network_is_used(root: Path) -> None:
    other = Listener(b"elsewhere")
    try:
        script = PROBE.format(python=sys.executable, forwarded=other.port, other=other.port)
        boot = emulated_boot(script, root, isolate=False)
        try:
            assert boot.isolation.startswith("process group only")
            wait_for(finished(boot), "the probe finished")
            assert (root / "other").read_text() == "elsewhere"
        finally:
            boot.stop()
    finally:
        other.socket.close()


#: a "worker" that starts a runc container the way the worker does (its state directory, the engine's layout)
#: and ignores SIGTERM, so stop() must SIGKILL it: the container runs on, detached, unless stop() cleans up
STUBBORN_WORKER = """#!{python}
import asyncio, os, signal, time
from levers9.hooks.facade import Hooks
from levers9.hooks.manager import PluginPolicy, load_plugins
from levers9.hooks.types import ContainerSpec, RuntimeContext

signal.signal(signal.SIGTERM, signal.SIG_IGN)
root = os.environ["LEVERS9_BOOT_ROOT"]
state = os.path.join(root, "var/lib/levers9/worker/runtime/runc")
hooks = Hooks(load_plugins(PluginPolicy()))
settings = hooks.runtime_settings_model("runc")
ctx = RuntimeContext(name="runc", settings=settings(), state_dir=state)
spec = ContainerSpec(container_id="l9-bootleft", image="host", command=["sleep", "600"], network="none")

async def start():
    prepared = await hooks.container_prepare(ctx, spec)
    await hooks.container_start(ctx, prepared)
    return (await hooks.container_state(ctx, "l9-bootleft")).pid

pid = asyncio.run(start())
open(os.path.join(root, "started"), "w").write(str(pid))
while True:
    time.sleep(1)
"""


def test_a_worker_killed_with_its_boot_leaves_no_container_behind(root: Path) -> None:
    if shutil.which("runc") is None:
        pytest.fail("this test needs runc: apt-get install -y runc")
    boot = emulated_boot(STUBBORN_WORKER.format(python=sys.executable), root)
    started = root / "started"
    wait_for(lambda: started.exists() and bool(started.read_text().strip()), "the container started", 120)
    container = int(started.read_text())
    assert live(container)
    mounts_before = [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if "l9-bootleft" in line]
    assert mounts_before, "the container's root is mounted below the boot's state directory"
    boot.stop(grace=0.5)
    assert not live(container), "the container's process outlived its boot"
    assert [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if "l9-bootleft" in line] == []
    assert list(Path("/sys/fs/cgroup").glob("**/levers9/l9-bootleft")) == []
    assert not root.exists()
