"""A call runs on a booted toycloud machine: levers9 up, this plugin, and the boot harness of levers9.testing.

The test is what a third party writes with levers9.testing alone: ``Levers9Up``
starts the real controlplane (``levers9 up`` in a subprocess) with one
toycloud pool of T4 machines; ``CloudBooter`` plays the toy cloud's
hypervisor, booting the user data of every instance the cloud reports
running (read from the cloud's side, :func:`levers9_toycloud.cloud.instances`)
in an emulated first boot whose ``nvidia-smi`` shows the instance's GPUs
(``levers9.testing.nvidia_smi``); a user program calls a function that needs
a T4, the scheduler provisions a toycloud machine, its cloud-init starts
``levers9 worker``, the worker registers with the join token the plugin
passed, and the call runs there. The program's result is checked, and so is
where the call ran: the worker of that machine, in the toycloud pool, which
saw the T4 the recording gives. At the end nothing is left: no live instance
in the cloud, no boot, no process that mentions the test's directories.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from levers9.discovery.nvidia_smi_query import parse_query_gpu
from levers9.testing import CloudBooter, FakeInstance, Levers9Up, nvidia_smi
from levers9_toycloud import cloud

#: the toy cloud's instance states, as levers9 names them (the booter boots ``running`` and stops the gone)
STATES = {"interrupted": "preempted", "error": "failed"}

PROGRAM = """
import json
import os

import levers9


@levers9.function(gpu="T4", cpu=0.25)
def inspect(x: int) -> dict:
    # the GPUs the worker gave the call, by UUID, and where the worker runs (its machine's root)
    return {
        "square": x * x,
        "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "cwd": os.environ.get("PWD"),
        "home": os.environ.get("HOME"),  # the call's own temporary directory, which must go with it
    }


print("RESULT", json.dumps(inspect.remote(7)), flush=True)
"""


def toycloud_instances(state_dir: Path) -> list[FakeInstance]:
    """Every instance the toy cloud holds, as the booter reads them: its own API's records, seen from the cloud."""
    return [
        FakeInstance(
            id=record["id"],
            state=STATES.get(record["state"], record["state"]),
            user_data=record.get("user_data", ""),
            tags=record["tags"],
            region=record.get("region"),
            zone=record.get("zone"),
            instance_type=record.get("instance_type"),
            gpu=record.get("gpu"),
            gpu_count=record.get("gpu_count") or 0,
        )
        for record in cloud.instances(state_dir)
    ]


def test_a_call_runs_on_a_booted_toycloud_machine_and_nothing_is_left(tmp_path: Path) -> None:
    state_dir = tmp_path / "cloud"
    pool: dict[str, Any] = {
        "provider": "toycloud",
        "runtime": "process",
        "workspace": "default",  # a pool whose runtime isolates nothing serves one workspace
        "gpu": "T4",
        "gpu_count": 1,
        "regions": ["toy-1"],
        "min_workers": 0,
        "max_workers": 1,
        "settings": {"state_dir": str(state_dir), "capacity": {"T4": 1}, "zones": ["a", "b"]},
    }
    up = Levers9Up({"toy-t4": pool}, tmp_path / "levers9")
    booter = CloudBooter([lambda: toycloud_instances(state_dir)], ports=up.ports, root=tmp_path)
    with booter:
        up.start()
        try:
            program = up.program(PROGRAM)
            # fails at once, naming the renderer and what the boot printed, if a booted machine's user data fails
            booter.wait_for(program.done, "the program's call", 600)
            run = program.result()
            tasks = json.loads(up.levers9("tasks", "--json").stdout)
        finally:
            left = up.stop()
        assert run.returncode == 0, f"{run.stdout}\n{run.stderr}\n{up.log()[-5000:]}"
        [line] = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
        result = json.loads(line.removeprefix("RESULT "))

        [instance] = cloud.instances(state_dir)
        assert result["square"] == 49
        # the call ran in the toycloud pool, on the worker of the machine toycloud started, which was given the
        # T4 of that instance's recorded nvidia-smi (its UUID is the instance's own) and runs in that boot's root
        [task] = tasks
        assert (task["status"], task["pool"], task["gpu"]) == ("complete", "toy-t4", "T4"), task
        [gpu] = parse_query_gpu(nvidia_smi("T4", 1, machine=instance["id"]))
        assert result["gpus"] == gpu.uuid, result
        assert list(booter.boots) == [instance["id"]]
        assert result["cwd"] == str(booter.boots[instance["id"]].root), result
        assert (booter.refused, booter.failed) == ({}, {})
        assert booter.boots[instance["id"]].renderer == "levers9.bootstrap.cloud_init"

        # levers9 up terminated its pool's machine on the way out; the booter stops its boot
        assert cloud.instances(state_dir)[0]["state"] == "terminated"
        booter.wait_for(lambda: instance["id"] in booter.stopped, "the terminated machine's boot to stop", 60)
        assert left == [], left
    assert booter.alive() == []
    assert not any(tmp_path.glob("l9cb-*")), "the booter left a boot root"
    assert not Path(result["home"]).exists(), f"the call's directory {result['home']} was left"
