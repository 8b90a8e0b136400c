"""The cloud booter boots each running instance once, with its GPUs, and stops it when the cloud says it is gone."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from levers9.bootstrap import cloud_init, shell_script
from levers9.hooks.types import WorkerBootstrap
from levers9.testing.boot import boot_environment, renderer_of
from levers9.testing.cloud_boot import BootFailed, BootTarget, CloudBooter

H100 = (Path(__file__).parents[1] / "data" / "gpu" / "nvidia_smi" / "h100_sxm_8x.csv").read_text()

#: what each booted "machine" does: say it is up, record what nvidia-smi shows it, then stay up
SCRIPT = """#!/bin/sh
echo "up as $$" > "$LEVERS9_BOOT_ROOT/up"
nvidia-smi --query-gpu=index,uuid,name,memory.total --format=csv,noheader,nounits > "$LEVERS9_BOOT_ROOT/gpus" 2>&1
echo "exit $?" >> "$LEVERS9_BOOT_ROOT/gpus"
exec sleep 600
"""


@dataclass
class Instance:
    id: str
    running: bool = True
    gone: bool = False
    user_data: str = SCRIPT
    instance_type: str | None = "p5.48xlarge"


@dataclass
class Cloud:
    instances: dict[str, Instance] = field(default_factory=dict)
    fail: bool = False

    def list(self) -> list[BootTarget]:
        if self.fail:
            raise ConnectionError("the fake cloud is restarting")
        return list(self.instances.values())


def _booted(booter: CloudBooter, instance_id: str) -> bool:
    """The instance's boot has run its nvidia-smi (its last line, ``exit N``, is written)."""
    boot = booter.boots.get(instance_id)
    return boot is not None and "exit " in _read(boot.root / "gpus")


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


def _until(check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.05)


def _pids_of(root: Path) -> list[int]:
    marker = f"LEVERS9_BOOT_ROOT={root}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if marker in Path(f"/proc/{entry}/environ").read_bytes():
                    found.append(int(entry))
            except OSError:
                continue
    return found


def test_running_instances_boot_once_with_their_gpus_and_stop_when_gone() -> None:
    cloud = Cloud({"i-1": Instance("i-1"), "i-2": Instance("i-2", instance_type="t3.micro", running=False)})
    hardware = {"p5.48xlarge": H100}
    booter = CloudBooter([cloud.list], ports=[], hardware=lambda i: hardware.get(i.instance_type or ""))
    with booter:
        _until(lambda: _booted(booter, "i-1"), "i-1 to boot")
        boot = booter.boots["i-1"]
        assert (boot.root / "up").read_text().startswith("up as ")
        shown = (boot.root / "gpus").read_text()
        assert shown == H100 + "exit 0\n"  # the machine's GPUs, as its type's recorded nvidia-smi printed them
        assert "i-2" not in booter.boots  # not running yet: nothing to boot

        # a listing that fails is not a vanished cloud: nothing is stopped
        cloud.fail = True
        booter.step()
        assert booter.stopped == []
        assert "i-1" in booter.alive()
        cloud.fail = False

        cloud.instances["i-2"].running = True
        _until(lambda: _booted(booter, "i-2"), "i-2 to boot")
        assert "nvidia-smi: not found\nexit 127" in _read(booter.boots["i-2"].root / "gpus")  # no GPUs, no nvidia-smi
        root = boot.root
        assert _pids_of(root)

        cloud.instances["i-1"].gone = True
        _until(lambda: "i-1" in booter.stopped, "i-1's boot to be stopped")
        assert not _pids_of(root)
        assert not root.exists()
        assert booter.alive() == ["i-2"]

        # an instance listed again after its boot was stopped is not booted a second time
        cloud.instances["i-1"].gone = False
        booter.step()
        assert list(booter.boots) == ["i-1", "i-2"]

        del cloud.instances["i-2"]  # left the listing altogether
        _until(lambda: "i-2" in booter.stopped, "i-2's boot to be stopped")
    assert booter.alive() == []
    assert not _pids_of(booter.boots["i-2"].root)


def test_user_data_that_cannot_boot_is_refused_with_the_reason_and_stop_leaves_nothing() -> None:
    cloud = Cloud(
        {
            "i-bad": Instance("i-bad", user_data="just text"),
            "i-ok": Instance("i-ok"),
            "i-bare": Instance("i-bare", user_data=""),
        }
    )
    booter = CloudBooter([cloud.list], ports=[]).start()
    try:
        _until(lambda: "i-bad" in booter.refused and "i-ok" in booter.boots, "both instances to be looked at")
        assert "neither a '#!' script nor '#cloud-config'" in booter.refused["i-bad"]
        booter.step()  # looked at once: neither is tried again
        assert list(booter.refused) == ["i-bad"]
        assert booter.bare == ["i-bare"]
        assert "i-bare" not in booter.boots
        root = booter.boots["i-ok"].root
        _until(lambda: bool(_pids_of(root)), "i-ok's boot to run")
    finally:
        booter.stop()
    assert not _pids_of(root)
    assert not root.exists()
    assert boot_environment(root)["PATH"].split(":")[1] == str(root / "usr" / "bin")


def test_each_boot_gets_the_environment_its_platform_gives_and_cannot_override_the_clean_one() -> None:
    script = (
        '#!/bin/sh\nprintf "%s|%s" "$AWS_EC2_METADATA_SERVICE_ENDPOINT" "$HOME" > "$LEVERS9_BOOT_ROOT/env"\n'
        "exec sleep 600\n"
    )
    cloud = Cloud({"i-1": Instance("i-1", user_data=script), "i-2": Instance("i-2", user_data=script)})

    def platform(instance: BootTarget) -> dict[str, str]:
        return {"AWS_EC2_METADATA_SERVICE_ENDPOINT": f"http://127.0.0.1:1/{instance.id}", "HOME": "/nowhere"}

    with CloudBooter([cloud.list], ports=[], platform=platform) as booter:
        for instance_id in ("i-1", "i-2"):
            _until(
                lambda i=instance_id: i in booter.boots and "|" in _read(booter.boots[i].root / "env"),  # type: ignore[misc]
                f"{instance_id} to boot",
            )
            root = booter.boots[instance_id].root
            assert _read(root / "env") == f"http://127.0.0.1:1/{instance_id}|{boot_environment(root)['HOME']}"


#: a "machine" whose service takes a while to stop once told to (a worker removing its containers)
SLOW_STOP = """#!/bin/sh
trap 'sleep 1; echo stopped cleanly > "$DONE_FILE"; exit 0' TERM
echo up > "$LEVERS9_BOOT_ROOT/up"
while :; do sleep 0.1; done
"""


def test_a_gone_instance_gets_the_grace_to_stop_before_it_is_killed(tmp_path: Path) -> None:
    for grace, expected in ((0.2, ""), (15.0, "stopped cleanly\n")):
        done = tmp_path / f"done-{grace}"
        cloud = Cloud({"i-1": Instance("i-1", user_data=SLOW_STOP.replace("$DONE_FILE", str(done)))})
        with CloudBooter([cloud.list], ports=[], grace=grace) as booter:
            _until(lambda: "up" in _read(booter.boots["i-1"].root / "up") if "i-1" in booter.boots else False, "boot")
            cloud.instances["i-1"].gone = True
            _until(lambda: "i-1" in booter.stopped, "the stop", timeout=30)
        assert _read(done) == expected, f"grace {grace}"


def _bootstrap(version: str) -> WorkerBootstrap:
    return WorkerBootstrap(
        controlplane_url="grpc://127.0.0.1:1",
        token="join-token-for-the-test",
        machine_id="mach_fast_fail",
        pool="cloud",
        levers9_version=version,
    )


@pytest.mark.parametrize(
    ("render", "renderer"),
    [(cloud_init, "levers9.bootstrap.cloud_init"), (shell_script, "levers9.bootstrap.shell_script")],
)
def test_a_boot_that_fails_says_why_at_once_naming_its_renderer(
    tmp_path: Path, render: Callable[[WorkerBootstrap], str], renderer: str
) -> None:
    """A bootstrap for another levers9 version, with no wheel to install it from, fails: the booter records it
    the moment the script exits, and wait_for raises BootFailed with why, not TimeoutError after its timeout."""
    cloud = Cloud({"i-1": Instance("i-1", user_data=render(_bootstrap("0.0.0-other")), instance_type=None)})
    with CloudBooter([cloud.list], ports=[], root=tmp_path) as booter:
        with pytest.raises(BootFailed) as failed:
            booter.wait_for(lambda: False, "a worker to register", timeout=600)
        assert booter.boots["i-1"].renderer == renderer
    message = str(failed.value)
    assert message.startswith(f"waiting for a worker to register: instance i-1: the boot of {renderer} exited with ")
    assert "status 1 while the instance runs" in message
    assert "no levers9 0.0.0-other on PATH" in message  # what the script printed: why it failed
    assert list(booter.failed) == ["i-1"]


def test_a_refused_user_data_fails_a_wait_at_once_and_a_clean_end_is_no_failure(tmp_path: Path) -> None:
    cloud = Cloud({"i-bad": Instance("i-bad", user_data="#cloud-config\nbootcmd: [reboot]\n")})
    with (
        CloudBooter([cloud.list], ports=[], root=tmp_path) as booter,
        pytest.raises(BootFailed, match=r"instance i-bad: its user data was not booted: .* uses bootcmd"),
    ):
        booter.wait_for(lambda: False, "a worker to register", timeout=600)
    cloud = Cloud({"i-done": Instance("i-done", user_data="#!/bin/sh\necho done\n")})
    with CloudBooter([cloud.list], ports=[], root=tmp_path) as booter:
        booter.wait_for(lambda: "i-done" in booter.boots and not booter.boots["i-done"].alive(), "the boot's end", 60)
        booter.step()
        assert booter.failed == {}  # exited 0: ended, not failed
        assert booter.boots["i-done"].renderer == "a '#!' script not rendered by levers9.bootstrap"
    with (
        CloudBooter([lambda: []], ports=[], root=tmp_path) as booter,
        pytest.raises(TimeoutError, match=r"^nothing to happen did not happen within 0\.3 s"),
    ):
        booter.wait_for(lambda: False, "nothing to happen", timeout=0.3)


@pytest.mark.parametrize(
    ("user_data", "renderer"),
    [
        ("#cloud-config\nruncmd: [[echo, hi]]\n", "a #cloud-config not rendered by levers9.bootstrap"),
        ("#cloud-config\nwrite_files: 3\n", "a #cloud-config not rendered by levers9.bootstrap"),
        ("#!/bin/bash\necho hi\n", "a '#!' script not rendered by levers9.bootstrap"),
        ("echo hi\n", "user data of no form a boot runs"),
    ],
)
def test_user_data_levers9_did_not_render_is_named_as_such(user_data: str, renderer: str) -> None:
    assert renderer_of(user_data) == renderer
