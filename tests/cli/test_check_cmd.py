"""``levers9 check``, run as an operator runs it: a subprocess of the installed command against a config file.

Pools use the real ``local`` provider, the ``toycloud`` example provider, the
real ``process`` and ``gvisor`` runtimes, and small provider plugins installed
for the test (through the ``installed`` fixture, as a third party's would be):
one whose ``levers9_check`` answers what its settings say, one that fails to
import. Standard output is a pipe here, so the table comes as tab-separated
values with a header line.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from levers9.__about__ import __version__
from levers9.services import agent_join
from levers9.services.agents import InventoryReport
from tests.cli.test_machine_cmd import Plane, plane
from tests.conftest import Installed
from tests.services.test_agent_hub import Agent

__all__ = ["plane"]

#: a provider whose answers its pool settings choose: ``mode`` ok, bad (ok=False with a hint), raise, text
FAKE_PROVIDER = """
from pydantic import BaseModel, ConfigDict

from levers9 import hookimpl
from levers9.hooks.errors import InsufficientCapacity
from levers9.hooks.types import Availability, GpuOffer, ProviderCheck


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    mode: str = "ok"
    price: float | None = None


@hookimpl
def levers9_provider_settings():
    return Settings


@hookimpl
def levers9_check(pool):
    mode = pool.settings.mode
    if mode == "raise":
        raise RuntimeError("the API answered 500")
    if mode == "bad":
        return ProviderCheck(ok=False, message="key rejected in " + str(pool.region), hint="export FAKE_KEY")
    if mode == "text":
        return "all good"
    return ProviderCheck(ok=True, message="credentials accepted in " + str(pool.region))


@hookimpl
def levers9_provision(request):
    raise InsufficientCapacity("levers9 check never provisions; this must not be called")


@hookimpl
def levers9_gpu_offers(pool):
    if pool.settings.mode == "raise":
        raise RuntimeError("the offers API answered 503")
    return [
        GpuOffer(gpu="H100", gpu_count=max(pool.gpu_count, 1), gpu_memory_mib=81559, instance_type="fake.h100",
                 region=region, zone=region + "a", spot=True, price_per_hour=pool.settings.price,
                 availability=Availability.LIMITED, details={"cloud": "secure", "form_factor": "sxm"})
        for region in pool.regions or ["eu-1"]
    ]
"""

#: a runtime whose capabilities hook raises instead of reporting
BROKEN_RUNTIME = """
from levers9 import hookimpl


@hookimpl
def levers9_runtime_capabilities(runtime):
    raise OSError("cannot read /proc/self/status")
"""


def install_fakes(installed: Installed) -> None:
    installed.add("levers9-fakecloud", {"fakecloud": "l9_fakecloud"}, {"l9_fakecloud": FAKE_PROVIDER})
    installed.add("levers9-broken", {"broken": "l9_broken"}, {"l9_broken": "raise ImportError('needs libfoo')\n"})
    installed.add("levers9-badrt", {"badrt": "l9_badrt"}, {"l9_badrt": BROKEN_RUNTIME})


def write_config(tmp_path: Path, pools: str) -> Path:
    path = tmp_path / "levers9.yaml"
    path.write_text("pools:\n" + pools)
    return path


def table(stdout: str) -> dict[str, dict[str, str]]:
    """The tab-separated table as {pool: {column: value}}."""
    header, *lines = stdout.splitlines()
    columns = header.split("\t")
    rows = [dict(zip(columns, line.split("\t"), strict=True)) for line in lines]
    return {row["pool"]: row for row in rows}


LOCAL_AND_TOY = """\
  cpu:
    provider: local
    runtime: process
    workspace: team
  toy:
    provider: toycloud
    runtime: process
    workspace: team
    gpu: T4
    settings: {{state_dir: {state}, capacity: {{T4: 1}}}}
"""


def test_usable_pools_exit_0_with_a_row_each(cli: Callable[..., Any], tmp_path: Path) -> None:
    config = write_config(tmp_path, LOCAL_AND_TOY.format(state=tmp_path / "toy"))
    result = cli("check", "--config", str(config))
    assert result.returncode == 0, result.stdout + result.stderr
    rows = table(result.stdout)
    assert list(rows) == ["cpu", "toy"]
    assert list(rows["cpu"]) == [
        "pool",
        "provider",
        "credentials and settings",
        "runtime",
        "runtime on this host",
        "checkpointing",
        "scheduler now",
        "usable",
    ]
    for name, provider in (("cpu", "local"), ("toy", "toycloud")):
        row = rows[name]
        assert (row["provider"], row["runtime"], row["usable"]) == (provider, "process", "yes")
        assert row["credentials and settings"].startswith("ok: ")
        assert row["runtime on this host"].startswith("ok: available: process")
        assert "isolation none" in row["runtime on this host"]
        # the process runtime isolates nothing, so nothing checkpoints it: said, not hidden
        assert row["checkpointing"] == "no: no installed plugin checkpoints containers of runtime 'process'"
    assert f"{config}: 2 of 2 pool(s) usable" in result.stderr


def test_json_has_one_object_per_pool(cli: Callable[..., Any], tmp_path: Path, installed: Installed) -> None:
    install_fakes(installed)
    config = write_config(
        tmp_path,
        "  good:\n    provider: fakecloud\n    runtime: process\n    workspace: team\n    region: eu-1\n"
        "  bad:\n    provider: fakecloud\n    runtime: process\n    workspace: team\n    regions: [eu-2, eu-3]\n    settings: {mode: bad}\n",
    )
    result = cli("check", "--config", str(config), "--json")
    assert result.returncode == 1
    good, bad = json.loads(result.stdout)
    assert good == {
        "pool": "good",
        "provider": "fakecloud",
        "runtime": "process",
        "usable": True,
        "provider_check": {"ok": True, "message": "credentials accepted in eu-1", "hint": None, "warning": False},
        "runtime_check": {
            "ok": True,
            "message": good["runtime_check"]["message"],
            "hint": None,
            "warning": False,
            "isolation": "none",
            "version": good["runtime_check"]["version"],
            "gpu": good["runtime_check"]["gpu"],
            "notes": good["runtime_check"]["notes"],
        },
        "checkpoint": {
            "ok": False,
            "message": "no installed plugin checkpoints containers of runtime 'process'",
            "hint": None,
            "warning": False,
            "mechanism": "none",
        },
        # no context here (the test's own LEVERS9_HOME): no controlplane is asked, and nothing fails for it
        "scheduler": {"ok": None, "message": good["scheduler"]["message"], "hint": None, "warning": False},
    }
    assert good["scheduler"]["message"].startswith("no controlplane asked")
    assert bad["usable"] is False
    assert bad["provider_check"] == {
        "ok": False,
        "message": "key rejected in eu-2",
        "hint": "export FAKE_KEY",
        "warning": False,
    }
    assert bad["runtime_check"]["ok"] is True  # the runtime was still asked


def test_failed_check_shows_the_hint_and_exits_1(cli: Callable[..., Any], tmp_path: Path, installed: Installed) -> None:
    install_fakes(installed)
    config = write_config(
        tmp_path,
        "  gpu:\n    provider: fakecloud\n    runtime: process\n    workspace: team\n    settings: {mode: bad}\n",
    )
    result = cli("check", "--config", str(config))
    assert result.returncode == 1
    row = table(result.stdout)["gpu"]
    assert row["credentials and settings"] == "FAIL: key rejected in None (hint: export FAKE_KEY)"
    assert row["usable"] == "no"
    assert "0 of 1 pool(s) usable" in result.stderr


def test_broken_plugins_are_failed_rows_and_the_rest_is_checked(
    cli: Callable[..., Any], tmp_path: Path, installed: Installed
) -> None:
    install_fakes(installed)
    config = write_config(
        tmp_path,
        "  cpu:\n    provider: local\n    runtime: process\n    workspace: team\n"
        "  unloadable:\n    provider: broken\n    runtime: process\n    workspace: team\n"
        "  raises:\n    provider: fakecloud\n    runtime: process\n    workspace: team\n    settings: {mode: raise}\n"
        "  wrong-type:\n    provider: fakecloud\n    runtime: process\n    workspace: team\n    settings: {mode: text}\n"
        "  bad-runtime:\n    provider: fakecloud\n    runtime: badrt\n"
        "  typo:\n    provider: fakecloud\n    runtime: process\n    workspace: team\n    settings: {mdoe: ok}\n",
    )
    result = cli("check", "--config", str(config))
    assert result.returncode == 1, result.stderr
    rows = table(result.stdout)
    assert list(rows) == ["cpu", "unloadable", "raises", "wrong-type", "bad-runtime", "typo"]
    assert rows["cpu"]["usable"] == "yes"
    assert "provider 'broken' is installed but not loaded" in rows["unloadable"]["credentials and settings"]
    assert "ImportError: needs libfoo" in rows["unloadable"]["credentials and settings"]
    assert rows["unloadable"]["runtime on this host"] == "-: not checked: the pool's config does not load"
    assert "RuntimeError: the API answered 500" in rows["raises"]["credentials and settings"]
    assert "levers9_check" in rows["raises"]["credentials and settings"]  # the hook is named
    assert "returned str, expected ProviderCheck" in rows["wrong-type"]["credentials and settings"]
    assert rows["bad-runtime"]["credentials and settings"].startswith("ok: ")
    assert "cannot read /proc/self/status" in rows["bad-runtime"]["runtime on this host"]
    assert rows["bad-runtime"]["runtime on this host"].startswith("FAIL: ")
    # a settings typo is a failed row with the config file's line and the accepted fields
    assert f"{config}:27: pools.typo.settings.mdoe: unknown field 'mdoe'" in rows["typo"]["credentials and settings"]
    assert all(rows[name]["usable"] == "no" for name in list(rows)[1:])
    assert "1 of 6 pool(s) usable" in result.stderr


def test_on_a_terminal_each_pool_is_a_block_of_lines_as_wide_as_the_terminal(
    cli: Callable[..., Any], tmp_path: Path, installed: Installed
) -> None:
    """Verdicts are sentences: as table cells a few characters wide they became cells of 30 lines; on a
    terminal each pool is a heading and one wrapped line per check instead."""
    install_fakes(installed)
    config = write_config(
        tmp_path,
        "  cpu:\n    provider: local\n    runtime: process\n    workspace: team\n"
        "  unloadable:\n    provider: broken\n    runtime: process\n    workspace: team\n",
    )
    result = cli("check", "--config", str(config), env={"COLUMNS": "100", "FORCE_COLOR": "1"})
    assert result.returncode == 1
    shown = re.sub(r"\x1b\[[0-9;]*m", "", result.stdout)
    lines = [line.rstrip() for line in shown.splitlines()]
    assert all(len(line) <= 100 for line in lines), lines
    headings = [line for line in lines if not line.startswith(" ")]
    assert headings == [
        "cpu  local · runtime process · usable: yes",
        "unloadable  broken · runtime process · usable: no",
    ]
    block = lines[lines.index(headings[1]) :]
    assert block[1].startswith("  credentials and settings: FAIL:")
    text = " ".join(line.strip() for line in block)
    assert "ImportError: needs libfoo" in text
    assert len(block) < 15, block  # a few lines per check, not a column of words


def test_unavailable_runtime_says_why_in_its_own_words(cli: Callable[..., Any], tmp_path: Path) -> None:
    missing = tmp_path / "no-such-runsc"
    config = write_config(
        tmp_path,
        f"  sandboxed:\n    provider: local\n    runtime: gvisor\n    runtime_settings: {{binary: {missing}}}\n",
    )
    result = cli("check", "--config", str(config), "--json")
    assert result.returncode == 1
    [row] = json.loads(result.stdout)
    assert row["usable"] is False
    assert row["provider_check"]["ok"] is True
    assert row["runtime_check"]["ok"] is False
    assert row["runtime_check"]["isolation"] == "sandbox"
    assert str(missing) in row["runtime_check"]["message"]
    # checkpointing: gVisor answers for itself, with the same reason
    assert row["checkpoint"]["mechanism"] == "runsc"
    assert row["checkpoint"]["ok"] is False
    assert str(missing) in row["checkpoint"]["message"]


def test_pool_option_selects_and_unknown_pool_exits_2(cli: Callable[..., Any], tmp_path: Path) -> None:
    config = write_config(tmp_path, LOCAL_AND_TOY.format(state=tmp_path / "toy"))
    result = cli("check", "--config", str(config), "--pool", "toy", "--json")
    assert result.returncode == 0, result.stderr
    assert [row["pool"] for row in json.loads(result.stdout)] == ["toy"]

    result = cli("check", "--config", str(config), "--pool", "tyo")
    assert result.returncode == 2
    assert "no pool named 'tyo'" in result.stderr
    assert "pools: cpu, toy" in result.stderr


def test_global_config_option_and_a_config_that_does_not_parse(cli: Callable[..., Any], tmp_path: Path) -> None:
    config = write_config(tmp_path, LOCAL_AND_TOY.format(state=tmp_path / "toy"))
    result = cli("--config", str(config), "check", "--json")
    assert result.returncode == 0, result.stderr
    assert len(json.loads(result.stdout)) == 2

    broken = tmp_path / "broken.yaml"
    broken.write_text("pools:\n  Bad_Name:\n    provider: local\n")
    result = cli("check", "--config", str(broken))
    assert result.returncode == 1
    assert result.stdout == ""
    assert f"{broken}:2" in result.stderr


def test_example_config(cli: Callable[..., Any]) -> None:
    """Every pool of the annotated example gets a row, and its config loads; its local pool is usable anywhere."""
    example = Path(__file__).resolve().parents[2] / "examples" / "levers9.yaml"
    result = cli("check", "--config", str(example), "--json")
    rows = {row["pool"]: row for row in json.loads(result.stdout)}
    assert set(rows) >= {"local", "default", "h100-aws", "a100-oci", "h100-lambda", "research-cluster", "l40s-lab"}
    assert rows["local"]["usable"] is True, rows["local"]
    assert rows["default"]["runtime_check"]["isolation"] == "sandbox"
    # gVisor says which network stack `auto` chose on this host, and why
    assert any(note.startswith("network 'auto'") for note in rows["default"]["runtime_check"]["notes"])
    # the cloud providers check their credentials; this host has none of the example's: said, with what to do
    clouds = {"h100-aws": "ProfileNotFound", "a100-oci": "/root/.oci/config", "h100-lambda": "LAMBDA_API_KEY"}
    for pool, named in clouds.items():
        check = rows[pool]["provider_check"]
        assert rows[pool]["usable"] is False, rows[pool]
        assert named in check["message"].replace(str(Path.home()), "/root"), check
        assert check["hint"], check
    # the Kubernetes pool reads its kubeconfig; this host has none and is no pod: said, with what to do
    assert rows["default"]["usable"] is False
    assert "no kubeconfig" in rows["default"]["provider_check"]["message"], rows["default"]
    assert rows["default"]["provider_check"]["hint"]
    # an attached cluster's agent dials a running controlplane, never this command: said, as for joined machines
    assert rows["research-cluster"]["usable"] is True, rows["research-cluster"]
    assert "no agent hub here" in rows["research-cluster"]["provider_check"]["message"]
    for row in rows.values():
        # what may fail is credentials or this host, never the example's own settings
        assert "not checked" not in row["runtime_check"]["message"], row


def test_local_pools_sharing_a_state_dir_are_all_writable_every_run(cli: Callable[..., Any], tmp_path: Path) -> None:
    """Pools are checked at once, in one process: each write probe is its own file, so none sees another's vanish.

    With one ``.check-<pid>`` file for all, one pool's unlink removed the file another had just written and that
    pool was reported unwritable in most runs; several runs of four pools catch the race.
    """
    state = tmp_path / "local-state"
    config = write_config(
        tmp_path,
        "".join(
            f"  p{n}:\n    provider: local\n    runtime: process\n    workspace: team\n    settings: {{state_dir: {state}}}\n"
            for n in range(4)
        ),
    )
    for run in range(4):
        result = cli("check", "--config", str(config), "--json")
        rows = json.loads(result.stdout)
        assert [row["provider_check"]["ok"] for row in rows] == [True] * 4, (run, rows)
        assert result.returncode == 0, result.stderr
        assert list(state.iterdir()) == []  # every probe removed


def test_a_process_pool_of_a_worker_that_cannot_drop_privileges_fails_unless_it_allows_calls_as_the_worker(
    tmp_path: Path,
) -> None:
    """As a user who is not root (nobody here), the process runtime cannot run calls as another user: a pool
    of it is unusable, with the fix; a pool that allows calls as the worker's user is usable, in red."""
    shared = Path(tempfile.mkdtemp(prefix="levers9-check-", dir="/tmp"))
    try:
        shared.chmod(0o1777)
        config = shared / "levers9.yaml"
        config.write_text(
            "pools:\n"
            f"  strict:\n    provider: local\n    runtime: process\n    workspace: me\n"
            f"    settings: {{state_dir: {shared / 'a'}}}\n"
            f"  single-user:\n    provider: local\n    runtime: process\n    workspace: me\n"
            f"    settings: {{state_dir: {shared / 'b'}}}\n"
            "    runtime_settings: {allow_calls_as_worker_user: true}\n"
        )
        config.chmod(0o644)
        env = {"PATH": os.environ["PATH"], "LEVERS9_HOME": str(shared / "home"), "COLUMNS": "300", "NO_COLOR": "1"}
        done = subprocess.run(
            [
                "runuser",
                "-u",
                "nobody",
                "--",
                sys.executable,
                "-m",
                "levers9.cli.main",
                "check",
                "--config",
                str(config),
                "--json",
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=False,
            cwd=shared,
        )
        assert done.returncode == 1, done.stderr
        rows = {row["pool"]: row for row in json.loads(done.stdout)}
        strict, single = rows["strict"]["runtime_check"], rows["single-user"]["runtime_check"]
        assert strict["ok"] is False
        assert "not root, so it cannot run calls as another user" in strict["message"]
        assert "allow_calls_as_worker_user: true" in strict["message"]
        assert single["ok"] is True
        assert single["warning"] is True
        assert "calls run as the worker's own user" in single["message"]
        assert rows["single-user"]["usable"] is True
        assert rows["strict"]["usable"] is False
    finally:
        shutil.rmtree(shared, ignore_errors=True)


# --------------------------------------------------------------------------- agent_machine pools: their joined machines


def test_an_agent_machine_pool_is_checked_on_its_joined_machines_not_on_this_host(
    plane: Plane, cli: Callable[..., Any], tmp_path: Path
) -> None:
    """Issue 35 item 17: the workers of an agent_machine pool run on the boxes joined to it, so ``check`` asks the
    controlplane of the context about them (connected, version, Docker); before, it checked this host's runtime."""
    config = str(tmp_path / "levers9.yaml")  # the plane's: pool lab is agent_machine, H100, gpu_runtime nvidia

    def lab() -> tuple[int, dict[str, Any]]:
        done = cli("check", "--config", config, "--pool", "lab", "--json", timeout=120)
        [row] = json.loads(done.stdout)
        return done.returncode, row

    code, row = lab()
    assert code == 1, row
    assert row["usable"] is False
    assert "none has joined pool lab (context 'test')" in row["runtime_check"]["message"], row
    assert "levers9 machine create --pool lab --ssh" in row["runtime_check"]["hint"]
    assert row["runtime_check"]["machines"] == []
    assert row["checkpoint"]["ok"] is None

    def joined(name: str, *, version: str, runtimes: list[str]) -> None:
        made = cli("machine", "create", "--pool", "lab", "--name", name, "--json")
        assert made.returncode == 0, made.stderr
        token = json.loads(made.stdout)["join_token"]

        async def join() -> Agent:
            identity = await agent_join.join(plane.services, token, version=version, hostname=name)
            agent = Agent(plane.hub, await agent_join.authenticate_agent(plane.services, identity.token))
            await agent.connect(version=version)
            assert agent.session is not None
            details = {
                "docker": {"version": "27.1.1", "runtimes": runtimes, "nvidia": "nvidia" in runtimes},
                "arch": "x86_64",
            }
            await agent.session.inventory(
                InventoryReport(
                    cpu_millicores=16000,
                    memory_mib=65536,
                    free_cpu_millicores=16000,
                    free_memory_mib=65536,
                    gpus=(("H100", 2, 2),),
                    details=details,
                )
            )
            return agent

        plane.agents.append(plane.run(join()))

    joined("old-box", version="0.0.9", runtimes=["runc"])
    code, row = lab()
    assert code == 1, row
    [old] = row["runtime_check"]["machines"]
    assert old["problems"] == [
        f"its agent is levers9 0.0.9, not {__version__}",
        "its Docker has no nvidia runtime (the NVIDIA Container Toolkit)",
    ]
    assert "0 of 1 ready" in row["runtime_check"]["message"]

    joined("new-box", version=__version__, runtimes=["runc", "nvidia"])
    code, row = lab()
    assert code == 0, row
    assert row["usable"] is True
    message = row["runtime_check"]["message"]
    assert (
        f"1 of 2 ready; new-box: levers9 {__version__}, Docker 27.1.1; old-box: its agent is levers9 0.0.9" in message
    )
    assert {m["name"]: m["ready"] for m in row["runtime_check"]["machines"]} == {"new-box": True, "old-box": False}

    # the table says it too, and a context that reaches no controlplane is a failed row naming it
    table = cli("check", "--config", config, "--pool", "lab", timeout=120)
    assert "joined machines: 1 of 2 ready" in table.stdout
    gone = cli("check", "--config", config, "--pool", "lab", "--json", env={"LEVERS9_HOME": str(tmp_path / "none")})
    [row] = json.loads(gone.stdout)
    assert gone.returncode == 1
    assert "no controlplane to ask for the joined machines" in row["runtime_check"]["message"]


def test_the_scheduler_column_says_why_the_controlplane_starts_nothing_of_a_pool(
    plane: Plane, cli: Callable[..., Any], tmp_path: Path
) -> None:
    """Issue 35 item 3: a quota the provider reported is shown by ``check`` as well as ``levers9 pools``."""
    config = str(tmp_path / "levers9.yaml")

    def lab() -> dict[str, Any]:
        done = cli("check", "--config", config, "--pool", "lab", "--json", timeout=120)
        [row] = json.loads(done.stdout)
        assert isinstance(row, dict)
        return row

    assert lab()["scheduler"] == {"ok": True, "message": "context 'test'", "hint": None, "warning": False}
    spec = plane.services.pools["lab"]
    reason = "quota_exceeded: [agent_machine] the account's H100 quota is 0 (VcpuLimitExceeded)"
    plane.run(plane.services.scheduler.ctx.unavailable.mark("lab", spec.gpu, spec.pool.region, reason, 60))
    row = lab()
    assert row["scheduler"]["ok"] is False
    assert row["scheduler"]["message"] == f"unavailable: {reason} (context 'test')"
    table = cli("check", "--config", config, "--pool", "lab", timeout=120)
    assert "VcpuLimitExceeded" in table.stdout
    # without a context nothing is asked, and nothing fails for it
    alone = cli("check", "--config", config, "--pool", "lab", "--json", env={"LEVERS9_HOME": str(tmp_path / "none")})
    [row] = json.loads(alone.stdout)
    assert row["scheduler"]["ok"] is None
    assert row["scheduler"]["message"].startswith("no controlplane asked")


def test_a_refused_payment_is_what_pools_and_check_show(plane: Plane, cli: Callable[..., Any], tmp_path: Path) -> None:
    """Issue 38: a marketplace's "insufficient balance" was mapped to a quota and ``levers9 pools`` still said ok.
    Here the pool's one joined machine refuses the provision order as ``billing_refused`` (an agent's typed refusal,
    as a provider raises ``BillingRefused``): the scheduler marks the pool, and both commands say so and what to do."""
    config = str(tmp_path / "levers9.yaml")
    made = cli("machine", "create", "--pool", "lab", "--name", "box", "--json")
    assert made.returncode == 0, made.stderr
    token = json.loads(made.stdout)["join_token"]

    async def refused() -> str:
        identity = await agent_join.join(plane.services, token, version=__version__, hostname="box")
        agent = Agent(plane.hub, await agent_join.authenticate_agent(plane.services, identity.token))
        plane.agents.append(agent)
        await agent.connect(version=__version__)
        assert agent.session is not None
        await agent.session.inventory(
            InventoryReport(
                cpu_millicores=16000,
                memory_mib=65536,
                free_cpu_millicores=16000,
                free_memory_mib=65536,
                gpus=(("H100", 2, 2),),
                details={"docker": {"version": "27.1.1", "runtimes": ["runc", "nvidia"], "nvidia": True}},
            )
        )
        provisioner = plane.services.scheduler.provisioner
        # the plane's lab pool leaves docker_network_mode at bridge, which agent_machine refuses for runc before
        # it asks any agent; the same pool on the host's network is asked
        spec = plane.services.pools["lab"]
        settings = spec.pool.settings.model_copy(update={"docker_network_mode": "host"})
        spec = dataclasses.replace(spec, pool=spec.pool.model_copy(update={"settings": settings}))
        machine_id = await provisioner.start(spec, "test")
        order = await agent.order()
        await agent.ack(order, ok=False, error="the account's balance is $0.00", error_kind="billing_refused")
        await asyncio.gather(*provisioner._tasks.values())
        return machine_id

    machine_id = plane.run(refused())
    machine = plane.run(plane.services.machines.get(machine_id))
    assert machine is not None
    assert machine.state.value == "failed"

    [lab] = [p for p in json.loads(cli("pools", "--json").stdout) if p["name"] == "lab"]
    why = lab["unavailable"]
    assert why.startswith("billing_refused: [agent_machine] agent "), why
    assert "refused the provision order: the account's balance is $0.00" in why
    assert "top up the balance (or fix the payment method) of the account provider 'agent_machine' uses" in why
    table = cli("pools")
    assert table.returncode == 0, table.stderr
    [row] = [line for line in table.stdout.splitlines() if line.startswith("lab\t")]
    assert row.split("\t")[-1] == f"unavailable: {why}"

    done = cli("check", "--config", config, "--pool", "lab", "--json", timeout=120)
    [checked] = json.loads(done.stdout)
    assert checked["scheduler"]["ok"] is False
    assert checked["scheduler"]["message"] == f"unavailable: {why} (context 'test')"
