"""``levers9 machine create|remove`` and ``levers9 machines``: boxes joined to a pool of provider agent_machine.

``machine create --pool P`` asks the controlplane (CreateJoinedMachine) for a
machine and its single-use join token, and prints the command to run on the
box, once: the token is in nothing else. The command installs levers9 from
the controlplane's own wheel (its URL and sha256 come with the answer; never
``levers9`` by name from a package index, another project's name there),
then joins. The agent dials the controlplane at
this context's address (``grpcs://``, with the context's CA when it has one;
a plain ``grpc://`` context gets ``--insecure`` and a warning, development
only). With ``--ssh user@host[:port]`` levers9 runs it on the box itself
(:func:`levers9.cli.machine_install.join.join_over_ssh`, paramiko imported only then),
with the pool's ``ssh`` settings as defaults that the flags override and the
pool's ``docker_host`` as the box's Docker (``--agent-dir`` puts the agent's
files under one directory of the box, run by a supervisor), then waits (up to
300 s) until the machine shows joined. ``--ssh`` is idempotent on the
machine's name: a machine of that name that has joined is not created again
(the box must run its agent, whose service is started if it is down; said
why not otherwise), one that never joined is made anew; a box holding the
credential of a machine the controlplane no longer lists (removed) has it
replaced; a machine whose box failed to join (the SSH steps, or the 300 s)
is removed, not left pending. ``machines`` lists the
caller's joined machines with their agents' last report; ``machine remove``
drains and stops its workers, revokes its agent and cuts it off.

Exit codes: 1 for what the controlplane refused (its message says why), 2 for
a bad argument, 3 when the SSH join failed or the machine did not join in time.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from levers9.cli.client_cmds import UNARY_TIMEOUT_S, Metadata, call, context_option, resolve_context, when
from levers9.cli.output import Col, err, iso, out, print_json, print_table

if TYPE_CHECKING:
    from levers9.proto.v1 import controlplane_pb2 as pb
    from levers9.proto.v1.controlplane_pb2_grpc import ControlPlaneStub
    from levers9.sdk.context import Context

__all__ = ["app", "join_url", "list_joined", "machines", "parse_ssh", "parse_ttl"]

app = typer.Typer(help="Join machines to levers9 and remove them.", no_args_is_help=True)

#: how long ``create --ssh`` waits for the agent to join after the SSH steps
JOIN_WAIT_S = 300.0
_TTL = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86_400}
_USER_HOST = re.compile(r"^(?:(?P<user>[^@\s]+)@)?(?P<host>\[[0-9A-Fa-f:.]+\]|[^:@\s]+)(?::(?P<port>\d+))?$")


def _fail(message: str, code: int = 2) -> typer.Exit:
    err.print(f"error: {message}", markup=False)
    return typer.Exit(code)


def parse_ttl(value: str) -> float:
    """``90``, ``90s``, ``30m``, ``1h``, ``7d`` as seconds; ValueError saying what is accepted."""
    match = _TTL.match(value)
    if match is None or float(match.group(1)) <= 0:
        raise ValueError(f"--ttl {value!r} is not a duration: write seconds or a number with s, m, h or d (1h, 30m)")
    return float(match.group(1)) * _UNITS[match.group(2)]


@dataclass(frozen=True)
class UserHost:
    user: str | None
    host: str
    port: int | None


def parse_ssh(value: str, what: str = "--ssh") -> UserHost:
    """``user@host[:port]`` (user and port optional; ``[v6]`` for an IPv6 address)."""
    match = _USER_HOST.match(value.strip())
    port = int(match.group("port")) if match and match.group("port") else None
    if match is None or (port is not None and not 0 < port < 65536):
        raise ValueError(f"{what} {value!r} is not user@host[:port] (for example ubuntu@10.0.0.5 or root@box:2222)")
    return UserHost(match.group("user"), match.group("host").strip("[]"), port)


def join_url(ctx: Context) -> tuple[str, bool]:
    """The URL the box's agent dials (this context's first address) and whether it is TLS."""
    from levers9.proto.target import parse_target

    target, tls = parse_target(ctx.addresses[0])
    return f"{'grpcs' if tls else 'grpc'}://{target}", tls


def _ca_pem(ctx: Context) -> str:
    if not ctx.ca_file:
        return ""
    path = Path(ctx.ca_file).expanduser()
    try:
        return path.read_text()
    except OSError as exc:
        raise _fail(f"cannot read the context's ca_file {str(path)!r}: {exc.strerror}", 1) from None


def _gpus(m: pb.JoinedMachine) -> str:
    return ", ".join(f"{g.free}/{g.count} {g.gpu}" for g in m.gpus) or "-"


def _as_dict(m: pb.JoinedMachine) -> dict[str, Any]:
    return {
        "id": m.id,
        "name": m.name,
        "pool": m.pool,
        "workspace_id": m.workspace_id or None,
        "state": m.state,
        "hostname": m.hostname or None,
        "connected": m.connected,
        "created_at": iso(m.created_at),
        "joined_at": iso(m.joined_at),
        "last_seen": iso(m.last_seen),
        "version": m.version or None,
        "gpus": [{"gpu": g.gpu, "count": g.count, "free": g.free} for g in m.gpus],
        "cpu_millicores": m.cpu_millicores,
        "memory_mib": m.memory_mib,
        "free_cpu_millicores": m.free_cpu_millicores,
        "free_memory_mib": m.free_memory_mib,
        "workers": list(m.workers),
        "docker_version": m.docker_version or None,
        "docker_runtimes": list(m.docker_runtimes),
        "arch": m.arch or None,
    }


def list_joined(context: str | None) -> list[pb.JoinedMachine]:
    """The caller's joined machines (an operator's: those of the shared pools), as `levers9 machines` lists them."""
    from levers9.proto.v1 import controlplane_pb2 as pb

    async def action(stub: ControlPlaneStub, metadata: Metadata) -> list[pb.JoinedMachine]:
        response: pb.ListJoinedMachinesResponse = await stub.ListJoinedMachines(
            pb.ListJoinedMachinesRequest(), metadata=metadata, timeout=UNARY_TIMEOUT_S
        )
        return list(response.machines)

    return call(context, action)


@app.command("create")
def create(
    pool: str = typer.Option(
        ..., "--pool", help="A pool of provider agent_machine (yours, or a shared one for operators)."
    ),
    name: str | None = typer.Option(None, "--name", help="The machine's name (default: the --ssh host, else its id)."),
    ttl: str = typer.Option("1h", "--ttl", help="How long the join token works: 90s, 30m, 1h, 7d."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (the join token included, shown this once)."),
    ssh: str | None = typer.Option(None, "--ssh", metavar="USER@HOST[:PORT]", help="Join the box over SSH now."),
    ssh_key: Path | None = typer.Option(None, "--ssh-key", help="Private key file (default: the pool's ssh.key_file)."),
    ssh_known_hosts: Path | None = typer.Option(None, "--ssh-known-hosts", help="known_hosts file to check against."),
    ssh_jump: str | None = typer.Option(None, "--ssh-jump", metavar="USER@HOST:PORT", help="Bastion to go through."),
    sudo: bool | None = typer.Option(None, "--sudo/--no-sudo", help="Install with (passwordless) sudo."),
    no_strict: bool = typer.Option(
        False, "--no-strict-host-key-checking", help="Accept an unknown host key (trusted networks only)."
    ),
    agent_dir: str | None = typer.Option(
        None,
        "--agent-dir",
        metavar="DIR",
        help="With --ssh: keep the agent's state, scripts, log and pid file "
        "under DIR on the box, run by a supervisor (default: system paths as root, else ~/.levers9).",
    ),
    context: str | None = context_option(),
) -> None:
    """Create a machine for a pool and print the one command that joins a box to it (shown once)."""
    from levers9.proto.v1 import controlplane_pb2 as pb

    try:
        ttl_s = parse_ttl(ttl)
        target = parse_ssh(ssh) if ssh else None
        jump = parse_ssh(ssh_jump, "--ssh-jump") if ssh_jump else None
    except ValueError as exc:
        raise _fail(str(exc)) from None
    if target is None and (ssh_key or ssh_known_hosts or jump or sudo is not None or no_strict or agent_dir):
        raise _fail(
            "--ssh-key, --ssh-known-hosts, --ssh-jump, --sudo, --no-strict-host-key-checking and --agent-dir need --ssh"
        )
    if agent_dir is not None and not agent_dir.startswith("/"):
        raise _fail(f"--agent-dir {agent_dir!r} must be an absolute path on the box")
    machine_name = name or (target.host if target is not None else None)
    ctx = resolve_context(context)
    url, tls = join_url(ctx)
    ca_pem = _ca_pem(ctx)
    if not tls:
        err.print(
            f"warning: this context reaches the controlplane in plain text ({url}); the agent is told --insecure, "
            "which is for development only: use a TLS controlplane for real machines",
            markup=False,
        )

    async def action(stub: ControlPlaneStub, metadata: Metadata) -> pb.CreateJoinedMachineResponse:
        made: pb.CreateJoinedMachineResponse = await stub.CreateJoinedMachine(
            pb.CreateJoinedMachineRequest(
                pool=pool, name=machine_name or "", ttl_s=ttl_s, existing_ok=target is not None and bool(machine_name)
            ),
            metadata=metadata,
            timeout=UNARY_TIMEOUT_S,
        )
        return made

    made = call(context, action)
    defaults: dict[str, Any] = json.loads(made.ssh_json or "{}")
    if made.existing:  # the same `machine create --ssh` again: the box must run that machine's agent
        assert target is not None
        _rejoin(
            context,
            made.machine,
            target,
            jump,
            defaults,
            url=url,
            ca_pem=ca_pem,
            key=ssh_key,
            known_hosts=ssh_known_hosts,
            sudo=sudo,
            no_strict=no_strict,
            agent_dir=agent_dir,
            as_json=as_json,
            wheel=_wheel(made),
        )
        return
    from levers9.services.agent_pools.joined_machines import join_command

    command = join_command(
        url, made.join_token, ca_pem=ca_pem, wheel_url=made.wheel_url, wheel_sha256=made.wheel_sha256
    )
    if target is None:
        if as_json:
            print_json(
                _as_dict(made.machine)
                | {"join_token": made.join_token, "join_command": command, "expires_at": iso(made.expires_at)}
            )
            return
        out.print(f"created machine {made.machine.name} ({made.machine.id}) for pool {pool}", markup=False)
        if not made.wheel_url:
            err.print(
                "note: this controlplane does not say where its HTTP listener is, so the command does not "
                "install levers9: install it on the box first (docs/agents.md)",
                markup=False,
            )
        err.print(f"run this on the box within {ttl} (the token works once and is shown only now):", markup=False)
        typer.echo(command)
        return
    try:
        joined_id = _join_over_ssh(
            made.machine,
            made.join_token,
            target,
            jump,
            defaults,
            context=context,
            url=url,
            ca_pem=ca_pem,
            key=ssh_key,
            known_hosts=ssh_known_hosts,
            sudo=sudo,
            no_strict=no_strict,
            agent_dir=agent_dir,
            wheel=_wheel(made),
        )
    except typer.Exit:
        _forget(context, made.machine, "the SSH join failed, and no box joined it")
        raise
    if joined_id != made.machine.id:  # the box runs the agent of an earlier machine: this one is not needed
        typer.echo(f"the box is already joined (agent {joined_id}); removing the machine just created")
        _remove(context, made.machine.name)
    joined = _wait_joined(context, joined_id, forget_pending=joined_id == made.machine.id)
    if as_json:
        print_json(_as_dict(joined))
    else:
        out.print(f"machine {joined.name} ({joined.id}) joined pool {joined.pool}", markup=False)


def _wheel(made: pb.CreateJoinedMachineResponse) -> tuple[str, str] | None:
    """The controlplane's wheel (URL, sha256), which --ssh installs where the worker image cannot be sent."""
    return (made.wheel_url, made.wheel_sha256) if made.wheel_url else None


def _forget(context: str | None, machine: pb.JoinedMachine, why: str) -> None:
    """Remove a machine no box joined, saying so (its join token is revoked with it): none is left pending."""
    typer.echo(f"removing machine {machine.name} ({machine.id}): {why}")
    _remove(context, machine.name)


def _rejoin(
    context: str | None,
    existing: pb.JoinedMachine,
    target: UserHost,
    jump: UserHost | None,
    defaults: dict[str, Any],
    *,
    url: str,
    ca_pem: str,
    key: Path | None,
    known_hosts: Path | None,
    sudo: bool | None,
    no_strict: bool,
    agent_dir: str | None,
    as_json: bool,
    wheel: tuple[str, str] | None,
) -> None:
    """``machine create --ssh`` of a machine that exists and has joined: the box must run its agent (its
    service is started again when it is down); no new machine, no token."""
    typer.echo(f"machine {existing.name} ({existing.id}) exists and has joined pool {existing.pool}: checking the box")
    joined_id = _join_over_ssh(
        existing,
        None,
        target,
        jump,
        defaults,
        context=context,
        url=url,
        ca_pem=ca_pem,
        key=key,
        known_hosts=known_hosts,
        sudo=sudo,
        no_strict=no_strict,
        agent_dir=agent_dir,
        wheel=wheel,
        not_joined=f"machine {existing.name} ({existing.id}) has joined from another box, or "
        "this box lost its credential: remove the machine first (levers9 machine remove "
        f"{existing.name}) or choose another --name",
    )
    if joined_id != existing.id:
        raise _fail(
            f"the box runs the agent of another machine ({joined_id}), not the one of {existing.name} "
            f"({existing.id}): choose another --name, or remove {existing.name} first "
            f"(levers9 machine remove {existing.name})",
            3,
        )
    joined = _wait_joined(context, existing.id)
    if as_json:
        print_json(_as_dict(joined))
    else:
        out.print(f"machine {joined.name} ({joined.id}) joined pool {joined.pool}", markup=False)


def _join_over_ssh(
    machine: pb.JoinedMachine,
    join_token: str | None,
    target: UserHost,
    jump: UserHost | None,
    defaults: dict[str, Any],
    *,
    context: str | None,
    url: str,
    ca_pem: str,
    key: Path | None,
    known_hosts: Path | None,
    sudo: bool | None,
    no_strict: bool,
    agent_dir: str | None = None,
    not_joined: str = "",
    wheel: tuple[str, str] | None = None,
) -> str:
    """Run the join on the box; the id of the agent it runs (an earlier one's when it was joined already)."""
    from levers9.cli.machine_install.box import AgentLayout
    from levers9.cli.machine_install.join import join_over_ssh
    from levers9.cli.machine_install.remote import SshJoinError, SshTarget

    default_jump = defaults.get("jump") or None
    jump_tuple: tuple[str, str, int] | None = None
    user = target.user or str(defaults.get("user") or "root")
    if jump is not None:
        jump_tuple = (jump.user or user, jump.host, jump.port or 22)
    elif isinstance(default_jump, dict):
        jump_tuple = (
            str(default_jump.get("user") or user),
            str(default_jump["host"]),
            int(default_jump.get("port") or 22),
        )
    key_default = defaults.get("key_file")
    hosts_default = defaults.get("known_hosts_file")
    ssh_target = SshTarget(
        user=user,
        host=target.host,
        port=target.port or int(defaults.get("port") or 22),
        key_file=key or (Path(key_default).expanduser() if key_default else None),
        known_hosts_file=known_hosts or (Path(hosts_default).expanduser() if hosts_default else None),
        strict_host_key_checking=False if no_strict else bool(defaults.get("strict_host_key_checking", True)),
        jump=jump_tuple,
        sudo=bool(defaults.get("sudo", False)) if sudo is None else sudo,
        connect_timeout_s=float(defaults.get("connect_timeout_s") or 10.0),
    )
    docker_host = str(defaults.get("docker_host") or "") or None
    layout = None
    if agent_dir is not None:
        base = agent_dir.rstrip("/") or "/"
        layout = AgentLayout(
            state_dir=f"{base}/agent",
            lib_dir=f"{base}/lib",
            log_file=f"{base}/agent.log",
            pid_file=f"{base}/agent-supervise.pid",
            service="supervisor",
        )
    typer.echo(f"joining {user}@{target.host} as machine {machine.name} ({machine.id})")

    def is_live(agent_id: str) -> bool:  # a credential of a machine the controlplane no longer lists is revoked
        return any(m.id == agent_id for m in list_joined(context))

    try:
        result = join_over_ssh(
            ssh_target,
            controlplane=url,
            join_token=join_token,
            ca_pem=ca_pem,
            docker_host=docker_host,
            echo=typer.echo,
            layout=layout,
            is_live=is_live,
            wheel=wheel,
        )
    except SshJoinError as exc:
        hint = f" ({not_joined})" if not_joined and "no join token was given" in str(exc) else ""
        raise _fail(f"joining {target.host} over SSH failed: {exc}{hint}", 3) from None
    if result.agent_id:
        return result.agent_id
    return machine.id


def _wait_joined(
    context: str | None, machine_id: str, timeout_s: float = JOIN_WAIT_S, *, forget_pending: bool = False
) -> pb.JoinedMachine:
    """Wait until the machine has joined and its agent is connected; ``forget_pending``: one that never joined
    by then is removed (its token revoked) rather than left pending."""
    deadline = time.monotonic() + timeout_s
    last = ""
    while True:
        found = next((m for m in list_joined(context) if m.id == machine_id), None)
        if found is None:
            raise _fail(f"machine {machine_id} is no longer listed (removed while joining?)", 3)
        state = f"{found.state}{', connected' if found.connected else ''}"
        if state != last:
            typer.echo(f"  machine {found.name}: {state}")
            last = state
        if found.state == "joined" and found.connected:
            return found
        if time.monotonic() >= deadline:
            if forget_pending and found.state == "pending":
                _forget(context, found, "it did not join in time")
            raise _fail(
                f"machine {found.name} did not join within {timeout_s:.0f} s (it is {state}); look at the agent's "
                "log on the box (journalctl -u levers9-agent, or the log the SSH steps named)",
                3,
            )
        time.sleep(2.0)


def _remove(context: str | None, name: str) -> pb.RemoveJoinedMachineResponse:
    from levers9.proto.v1 import controlplane_pb2 as pb

    async def action(stub: ControlPlaneStub, metadata: Metadata) -> pb.RemoveJoinedMachineResponse:
        removed: pb.RemoveJoinedMachineResponse = await stub.RemoveJoinedMachine(
            pb.RemoveJoinedMachineRequest(name=name), metadata=metadata, timeout=UNARY_TIMEOUT_S * 4
        )
        return removed

    return call(context, action)


@app.command("remove")
def remove(
    name: str = typer.Argument(..., metavar="NAME", help="The machine's name (levers9 machines lists them)."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
    context: str | None = context_option(),
) -> None:
    """Drain the machine, stop its workers, revoke its agent and cut it off (it cannot join again)."""
    if not yes and not typer.confirm(f"remove machine {name}? its workers stop and its agent is revoked"):
        raise typer.Exit(1)
    removed = _remove(context, name)
    out.print(
        f"removed machine {removed.machine.name} ({removed.machine.id}): {len(removed.terminated)} workers stopped",
        markup=False,
    )
    if removed.not_terminated:
        err.print(
            f"warning: {len(removed.not_terminated)} workers could not be stopped now "
            f"({', '.join(removed.not_terminated)}); the controlplane keeps trying",
            markup=False,
        )


def _list_all(
    context: str | None, pool: str | None, ended: bool
) -> tuple[list[pb.JoinedMachine], list[pb.MachineSummary] | None]:
    """The joined machines, and the machines started from providers (None: the token is not an operator's)."""
    import grpc

    from levers9.proto.v1 import controlplane_pb2 as pb

    states = ["requested", "starting", "running", "draining", "terminating", "terminated", "failed"] if ended else []

    async def action(
        stub: ControlPlaneStub, metadata: Metadata
    ) -> tuple[list[pb.JoinedMachine], list[pb.MachineSummary] | None]:
        joined: pb.ListJoinedMachinesResponse = await stub.ListJoinedMachines(
            pb.ListJoinedMachinesRequest(), metadata=metadata, timeout=UNARY_TIMEOUT_S
        )
        try:
            started: pb.ListMachinesResponse = await stub.ListMachines(
                pb.ListMachinesRequest(pool=pool or "", states=states), metadata=metadata, timeout=UNARY_TIMEOUT_S
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.PERMISSION_DENIED:
                raise
            return list(joined.machines), None  # a workspace user's token: its joined machines only
        return list(joined.machines), list(started.machines)

    return call(context, action)


def _started_dict(m: pb.MachineSummary) -> dict[str, Any]:
    return {
        "kind": "provider",
        "id": m.id,
        "pool": m.pool,
        "provider": m.provider,
        "state": m.state,
        "instance_type": m.instance_type or None,
        "region": m.region or None,
        "zone": m.zone or None,
        "price_per_hour": m.price_per_hour if m.HasField("price_per_hour") else None,
        "gpu": m.gpu or None,
        "gpu_count": m.gpu_count,
        "created_at": iso(m.created_at),
        "worker_id": m.worker_id or None,
        "last_error": m.last_error or None,
    }


def _price(m: pb.MachineSummary) -> str:
    return f"${m.price_per_hour:.2f}/h" if m.HasField("price_per_hour") else "-"


def machines(
    as_json: bool = typer.Option(
        False, "--json", help="Print JSON: one object per machine, its kind joined or provider."
    ),
    pool: str | None = typer.Option(None, "--pool", "-p", help="Only this pool's machines started from a provider."),
    ended: bool = typer.Option(False, "--all", help="Also machines started from a provider that have ended."),
    context: str | None = context_option(),
) -> None:
    """List machines: those joined (state, last heartbeat, GPUs free/total, free CPU and memory, workers), then,
    for an operator, those started from the pools' providers (pool, provider, state, instance type, zone, price)."""
    found, started = _list_all(context, pool, ended)
    if pool:
        found = [m for m in found if m.pool == pool]
    if as_json:
        print_json([{"kind": "joined", **_as_dict(m)} for m in found] + [_started_dict(m) for m in started or []])
        return
    if not found and not started:
        err.print(
            "no joined machines (join one with `levers9 machine create --pool POOL`)"
            + ("" if started is None else " and no machines started from the pools' providers"),
            markup=False,
        )
        return
    if found:
        _joined_table(found)
    if started:
        if found:
            out.print("", markup=False)
        _started_table(started)


def _started_table(started: list[pb.MachineSummary]) -> None:
    now = time.time()
    print_table(
        [
            Col("machine"),
            Col("pool"),
            Col("provider"),
            Col("state"),
            Col("instance type"),
            Col("zone"),
            Col("price", justify="right"),
            Col("GPUs"),
            Col("started"),
        ],
        (
            [
                m.id,
                m.pool,
                m.provider,
                m.state,
                m.instance_type or "-",
                m.zone or m.region or "-",
                _price(m),
                f"{m.gpu_count}x {m.gpu}" if m.gpu else "cpu",
                when(m.created_at, now),
            ]
            for m in started
        ),
    )


def _joined_table(found: list[pb.JoinedMachine]) -> None:
    now = time.time()
    print_table(
        [
            Col("name"),
            Col("pool"),
            Col("state"),
            Col("connected"),
            Col("last heartbeat"),
            Col("GPUs (free/total)"),
            Col("free CPU"),
            Col("free memory"),
            Col("workers"),
        ],
        (
            [
                m.name,
                m.pool,
                m.state,
                "yes" if m.connected else "no",
                when(m.last_seen, now),
                _gpus(m),
                f"{m.free_cpu_millicores / 1000:g}/{m.cpu_millicores / 1000:g}",
                f"{m.free_memory_mib}/{m.memory_mib} MiB",
                str(len(m.workers)),
            ]
            for m in found
        ),
    )
