"""``levers9 cluster join|remove`` and ``levers9 clusters``: Kubernetes clusters attached to the caller's workspace.

``cluster join NAME --gpu TYPE --image IMAGE --worker-image IMAGE`` asks the
controlplane (JoinCluster) for the cluster's pool and its agent's single-use
join token, writes the manifest that starts the agent
(:mod:`levers9.kubernetes_manifests.agent`) to ``--output`` (default
``levers9-cluster-NAME.yaml``, mode 0600: it holds the token, which is in
nothing else) and prints the lines to run with the cluster's own kube context:
the namespace when it is missing (it is not in the manifest, so ``kubectl
delete -f`` of it never removes the namespace), then ``kubectl apply``.
``--share-namespace`` lets the agent start in a namespace that holds another
levers9 pool's worker Jobs (it refuses otherwise, naming them). The agent dials the addresses the controlplane advertises to
its workers (every replica, so it fails over between them) with the
controlplane's CA, else this context's address and CA (``grpcs://``; a plain
``grpc://`` one gets ``--insecure`` and a warning, development only). ``clusters`` lists the
workspace's clusters, connected or not, with their agents' last report;
``cluster remove`` stops its workers, revokes its agent (which then deletes
its own worker Jobs, never another pool's, and exits), forgets its pool, and
prints the lines that remove the agent's objects (the namespace stays).

Exit codes: 1 for what the controlplane refused (its message says why), 2 for a
bad argument or an output file that cannot be written.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from levers9.cli.client_cmds import UNARY_TIMEOUT_S, Metadata, call, context_option, resolve_context, when
from levers9.cli.machine_cmd import join_url, parse_ttl
from levers9.cli.output import Col, err, iso, out, print_json, print_table

if TYPE_CHECKING:
    from levers9.proto.v1 import controlplane_pb2 as pb
    from levers9.proto.v1.controlplane_pb2_grpc import ControlPlaneStub

__all__ = ["app", "clusters"]

app = typer.Typer(help="Attach Kubernetes clusters to your workspace.", no_args_is_help=True)


def _fail(message: str, code: int = 2) -> typer.Exit:
    err.print(f"error: {message}", markup=False)
    return typer.Exit(code)


def _gpus(c: pb.Cluster) -> str:
    return ", ".join(f"{g.free}/{g.count} {g.gpu}" for g in c.gpus) or "-"


def _as_dict(c: pb.Cluster) -> dict[str, Any]:
    return {
        "id": c.id,
        "name": c.name,
        "pool": c.pool,
        "gpu": c.gpu or None,
        "gpu_count": c.gpu_count,
        "namespace": c.namespace,
        "agent_id": c.agent_id or None,
        "connected": c.connected,
        "last_seen": iso(c.last_seen),
        "version": c.version or None,
        "nodes": c.nodes,
        "gpus": [{"gpu": g.gpu, "count": g.count, "free": g.free} for g in c.gpus],
        "cpu_millicores": c.cpu_millicores,
        "memory_mib": c.memory_mib,
        "workers": list(c.workers),
        "created_at": iso(c.created_at),
    }


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only (it holds the join token)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    fd = os.open(path, flags, 0o600)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as handle:
            fd = -1
            handle.write(text)
    finally:
        if fd >= 0:
            os.close(fd)


@app.command("join")
def join(
    name: str = typer.Argument(..., help="The cluster's name in your workspace (a DNS label, like gpu-lab)."),
    gpu: str | None = typer.Option(None, "--gpu", help="The GPU type its workers get (levers9 gpu list); none: CPU."),
    gpu_count: int | None = typer.Option(None, "--gpu-count", help="GPUs per worker pod (default 1 with --gpu)."),
    image: str = typer.Option(
        ..., "--image", help="The agent's image: levers9 with its Kubernetes client, pullable in the cluster."
    ),
    worker_image: str | None = typer.Option(
        None, "--worker-image", help="The workers' image, pullable in the cluster (required but with --pool)."
    ),
    namespace: str = typer.Option("levers9", "--namespace", help="Where the agent and its worker Jobs live."),
    cpu: float | None = typer.Option(None, "--cpu", help="CPU cores per worker pod (default 1)."),
    memory: str | None = typer.Option(None, "--memory", help="Memory per worker pod: MiB or a size like 16GiB."),
    max_workers: int | None = typer.Option(None, "--max-workers", help="At most this many workers (default 10)."),
    idle_timeout: float | None = typer.Option(
        None, "--idle-timeout", help="Seconds before an idle worker is released (default 300)."
    ),
    runtime: str | None = typer.Option(None, "--runtime", help="The workers' container runtime (default runc)."),
    privileged: bool = typer.Option(
        False, "--privileged", help="Worker pods run privileged (the runc and gvisor runtimes need it)."
    ),
    settings: str | None = typer.Option(
        None, "--settings", help="Further attached_cluster settings as JSON (tolerations, node_selector...)."
    ),
    pool: str | None = typer.Option(
        None, "--pool", help="Operators: the configured attached_cluster pool of a shared cluster (its agent joins)."
    ),
    share_namespace: bool = typer.Option(
        False,
        "--share-namespace",
        help="The agent may work in a namespace where another levers9 pool (a local_k8s pool, another cluster's "
        "agent) has worker Jobs; each acts on its own only.",
    ),
    output: Path | None = typer.Option(None, "--output", "-o", help="Where to write the manifest.", dir_okay=False),
    ttl: str = typer.Option("1h", "--ttl", help="How long the join token works: 90s, 30m, 1h, 7d."),
    as_json: bool = typer.Option(False, "--json", help="Print the cluster as JSON (the token stays in the file)."),
    context: str | None = context_option(),
) -> None:
    """Attach a cluster: its pool, and the manifest that starts its agent (apply it with your kube context)."""
    from levers9.kubernetes_manifests.agent import AgentManifest, apply_lines, render_agent
    from levers9.kubernetes_manifests.render import to_yaml
    from levers9.proto.v1 import controlplane_pb2 as pb

    try:
        ttl_s = parse_ttl(ttl)
    except ValueError as exc:
        raise _fail(str(exc)) from None
    try:
        extra: Any = json.loads(settings) if settings else {}
    except ValueError as exc:
        raise _fail(f"--settings is not JSON: {exc}") from None
    if not isinstance(extra, dict):
        raise _fail("--settings must be a JSON object of attached_cluster settings")
    if privileged:
        extra["privileged"] = True
    path = output or Path(f"levers9-cluster-{name}.yaml")
    ctx = resolve_context(context)
    url, tls = join_url(ctx)
    try:
        ca_pem = Path(ctx.ca_file).expanduser().read_text() if ctx.ca_file else ""
    except OSError as exc:
        raise _fail(f"cannot read the context's ca_file {ctx.ca_file!r}: {exc.strerror}", 1) from None
    request = pb.JoinClusterRequest(
        name=name,
        gpu=gpu or "",
        memory=memory or "",
        runtime=runtime or "",
        namespace=namespace,
        worker_image=worker_image or "",
        settings_json=json.dumps(extra) if extra else "",
        ttl_s=ttl_s,
        pool=pool or "",
    )
    for field, value in (
        ("gpu_count", gpu_count),
        ("cpu", cpu),
        ("max_workers", max_workers),
        ("idle_timeout_s", idle_timeout),
    ):
        if value is not None:
            setattr(request, field, value)
    manifest = AgentManifest(
        cluster=name,
        namespace=namespace,
        image=image,
        controlplane_url=url,
        join_token="unset",
        ca_pem=ca_pem,
        allow_privileged=privileged,
        share_namespace=share_namespace,
    )
    try:
        manifest.check()  # refused here, before a cluster is recorded for a manifest that cannot be written
    except ValueError as exc:
        raise _fail(str(exc)) from None

    async def action(stub: ControlPlaneStub, metadata: Metadata) -> pb.JoinClusterResponse:
        made: pb.JoinClusterResponse = await stub.JoinCluster(request, metadata=metadata, timeout=UNARY_TIMEOUT_S)
        return made

    made = call(context, action)
    # the agent dials what the controlplane advertises to its workers (every replica, so it fails over), with
    # the controlplane's own CA; this context's address and CA only when it advertises none
    if made.controlplane_url:
        url, tls = made.controlplane_url, made.controlplane_url.startswith("grpcs://")
        manifest = replace(manifest, controlplane_url=url, ca_pem=made.ca_pem or ca_pem)
    # the namespace the pool's Jobs go to (an operator's configured pool says its own)
    manifest = replace(manifest, namespace=made.cluster.namespace or manifest.namespace)
    objects = render_agent(replace(manifest, join_token=made.join_token))
    header = (
        f"# levers9: the agent of attached cluster {name} (pool {made.cluster.pool}), written by "
        "`levers9 cluster join`.\n# It holds a single-use join token: apply it once, then delete this file.\n"
    )
    text = header + to_yaml(objects).split("\n", 1)[1]
    try:
        _write_private(path, text)
    except OSError as exc:
        raise _fail(
            f"cannot write {str(path)!r} ({exc.strerror}); the cluster {name} is recorded, and its token is lost "
            "with this run: join it again under another name, or write to another --output",
            2,
        ) from None
    if not tls:
        err.print(
            f"warning: this context reaches the controlplane in plain text ({url}); the agent is told --insecure, "
            "which is for development only: use a TLS controlplane for real clusters",
            markup=False,
        )
    if as_json:
        print_json(_as_dict(made.cluster) | {"manifest": str(path), "expires_at": iso(made.expires_at)})
        return
    out.print(f"attached cluster {name} as pool {made.cluster.pool}; its agent's manifest: {path}", markup=False)
    err.print(
        f"apply it within {ttl} with the cluster's own kube context (the token works once); the namespace is made "
        "apart, so `kubectl delete -f` of the manifest never removes it:",
        markup=False,
    )
    for line in apply_lines(str(path), manifest.namespace, allow_privileged=privileged):
        typer.echo(line)


@app.command("remove")
def remove(
    name: str = typer.Argument(..., help="The attached cluster's name."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
    context: str | None = context_option(),
) -> None:
    """Detach a cluster: its workers stop, its agent is revoked and deletes its worker Jobs, its pool goes."""
    from levers9.kubernetes_manifests.agent import delete_lines
    from levers9.proto.v1 import controlplane_pb2 as pb

    if not yes and not typer.confirm(f"remove cluster {name}? its workers stop and its agent is revoked"):
        raise typer.Exit(1)

    async def action(stub: ControlPlaneStub, metadata: Metadata) -> pb.RemoveClusterResponse:
        removed: pb.RemoveClusterResponse = await stub.RemoveCluster(
            pb.RemoveClusterRequest(name=name), metadata=metadata, timeout=UNARY_TIMEOUT_S
        )
        return removed

    removed = call(context, action)
    out.print(
        f"removed cluster {name} (pool {removed.cluster.pool}): {len(removed.terminated)} workers stopped, "
        f"{len(removed.agents)} agents revoked",
        markup=False,
    )
    if removed.not_terminated:
        err.print(
            f"warning: {len(removed.not_terminated)} workers could not be stopped now "
            f"({', '.join(removed.not_terminated)}); the revoked agent deletes its worker Jobs when it hears",
            markup=False,
        )
    namespace = removed.cluster.namespace or "levers9"
    err.print(
        "the agent's own objects stay in the cluster until you delete them, with the cluster's kube context (or "
        f"kubectl delete -f <its manifest>); namespace {namespace} and anything else in it stay:",
        markup=False,
    )
    for line in delete_lines(name, namespace):
        err.print(line, markup=False)


def clusters(
    as_json: bool = typer.Option(False, "--json", help="Print JSON: one object per cluster."),
    context: str | None = context_option(),
) -> None:
    """List your workspace's attached clusters, connected or not: pool, agent, nodes, GPUs (free/total), workers."""
    from levers9.proto.v1 import controlplane_pb2 as pb

    async def action(stub: ControlPlaneStub, metadata: Metadata) -> list[pb.Cluster]:
        response: pb.ListClustersResponse = await stub.ListClusters(
            pb.ListClustersRequest(), metadata=metadata, timeout=UNARY_TIMEOUT_S
        )
        return list(response.clusters)

    found = call(context, action)
    if as_json:
        print_json([_as_dict(c) for c in found])
        return
    if not found:
        err.print("no attached clusters (attach one with `levers9 cluster join NAME --gpu TYPE`)", markup=False)
        return
    now = time.time()
    print_table(
        [
            Col("name"),
            Col("pool"),
            Col("connected"),
            Col("last heartbeat"),
            Col("nodes"),
            Col("GPUs (free/total)"),
            Col("workers"),
        ],
        (
            [
                c.name,
                c.pool,
                "yes" if c.connected else "no",
                when(c.last_seen, now) if c.last_seen else "never",
                str(c.nodes),
                _gpus(c),
                str(len(c.workers)),
            ]
            for c in found
        ),
    )
