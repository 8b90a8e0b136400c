"""``levers9 kubernetes``: run the levers9 controlplane on Kubernetes, with no Helm binary.

``manifests`` renders the objects (:mod:`levers9.kubernetes_manifests`) as
multi-document YAML on standard output, or into ``-o FILE``; standard error
gets the notes on the choices made and the ``kubectl`` lines to run: the
Secrets first (the manifests only name them), then ``kubectl apply``.
``write-config`` is what each controlplane pod's init container runs: it
completes the ConfigMap's config file with the database and Redis URLs from its
environment (given from the Secrets) and writes it, mode 0600, where the server
reads it.

Exit codes: 0 done; 2 a bad option, a config that cannot run in the pods, or
(``write-config``) a URL missing or not of its kind; every message names the
flag, the config field or the variable, and none repeats a URL.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from levers9.cli.output import err

if TYPE_CHECKING:
    from pydantic import ValidationError

    from levers9.kubernetes_manifests import ManifestOptions

__all__ = ["app"]

app = typer.Typer(help="Run the levers9 controlplane on Kubernetes.", no_args_is_help=True)

_NAME = "levers9 kubernetes manifests"


@app.callback()
def _group() -> None:
    """Run the levers9 controlplane on Kubernetes."""


def _fail(message: str, command: str = _NAME) -> typer.Exit:
    err.print(f"{command}: {message}", markup=False)
    return typer.Exit(2)


def _option_errors(exc: ValidationError) -> str:
    """Each error of the options model, named by the flag that sets the field."""
    from levers9.kubernetes_manifests.options import FLAGS

    lines = []
    for error in exc.errors(include_input=False, include_url=False):
        loc = error["loc"]
        message = str(error["msg"]).removeprefix("Value error, ")
        flag = FLAGS.get(str(loc[0])) if loc else None
        lines.append(f"{flag}: {message}" if flag else message)
    return "; ".join(lines)


def _optional(value: str | None) -> str | None:
    """A size option where 'none' (or an empty string) means no limit."""
    return None if value is None or value.strip().lower() in ("", "none") else value


@app.command("manifests")
def manifests(
    image: str = typer.Option(
        ...,
        "--image",
        help="The controlplane's image, pushed to a registry the cluster pulls from: levers9 with the postgres and "
        "k8s extras (docs/deploy.md, Kubernetes).",
    ),
    namespace: str = typer.Option("levers9", "--namespace", help="Namespace of the controlplane."),
    replicas: int = typer.Option(2, "--replicas", help="Controlplane replicas; 2 or more for failover."),
    config: Path | None = typer.Option(
        None,
        "--config",
        dir_okay=False,
        help="The levers9 config file the controlplane runs (it goes into a ConfigMap, without URLs or keys). "
        "Default: a starter config with one local_k8s CPU pool.",
    ),
    worker_image: str | None = typer.Option(
        None, "--worker-image", help="The starter config's worker image (default: levers9/worker:<version>)."
    ),
    worker_namespace: list[str] | None = typer.Option(
        None,
        "--worker-namespace",
        help="Namespace where local_k8s creates worker Jobs, each given a Role (repeat for several). Default: "
        "the namespaces of the config's local_k8s pools; with the starter config, --namespace.",
    ),
    database_secret: str = typer.Option(
        "levers9-database", "--database-secret", help="Secret whose key 'url' holds the PostgreSQL URL."
    ),
    redis_secret: str = typer.Option(
        "levers9-redis", "--redis-secret", help="Secret whose key 'url' holds the Redis URL."
    ),
    secret_key_secret: str = typer.Option(
        "levers9-secret-key", "--secret-key-secret", help="Secret whose key 'key' holds the secret key(s)."
    ),
    tls_secret: str | None = typer.Option(
        None, "--tls-secret", help="Secret with tls.crt and tls.key: serve TLS. Default: plain text in the cluster."
    ),
    tls_ca: bool = typer.Option(True, "--tls-ca/--no-tls-ca", help="The TLS Secret holds ca.crt for the workers."),
    service_type: str = typer.Option("ClusterIP", "--service-type", help="ClusterIP or LoadBalancer (needs TLS)."),
    cpu_request: str = typer.Option("500m", "--cpu-request", help="CPU per replica: cores or millicores."),
    cpu_limit: str | None = typer.Option(None, "--cpu-limit", help="CPU limit per replica (default: none)."),
    memory_request: str = typer.Option("1Gi", "--memory-request", help="Memory per replica."),
    memory_limit: str | None = typer.Option("2Gi", "--memory-limit", help="Memory limit per replica; 'none': none."),
    image_pull_secret: list[str] | None = typer.Option(
        None, "--image-pull-secret", help="docker-registry Secret for a private registry (repeat for several)."
    ),
    output: Path | None = typer.Option(None, "-o", "--output", dir_okay=False, help="Write the YAML to FILE."),
) -> None:
    """Print the Kubernetes manifests of a levers9 controlplane for a team, and what to run to apply them."""
    from pydantic import ValidationError

    from levers9.kubernetes_manifests import ManifestError, ManifestOptions, render, to_yaml
    from levers9.kubernetes_manifests.instructions import setup_commands

    raw, needed = _read_config(config) if config is not None else (None, None)
    workers: tuple[str, ...] | None = tuple(worker_namespace) if worker_namespace else None
    if needed is not None:
        missing = {pool: ns for pool, ns in needed.items() if workers is not None and ns not in workers}
        if missing:
            pool, ns = next(iter(missing.items()))
            raise _fail(
                f"pools.{pool}.settings.namespace is {ns!r}, which --worker-namespace leaves out; add "
                f"--worker-namespace {ns} so the controlplane may create its Jobs there"
            )
        if workers is None:
            workers = tuple(sorted(set(needed.values())))
    values: dict[str, Any] = {
        "namespace": namespace,
        "replicas": replicas,
        "image": image,
        "database_secret": database_secret,
        "redis_secret": redis_secret,
        "secret_key_secret": secret_key_secret,
        "tls_secret": tls_secret,
        "tls_ca": tls_ca,
        "worker_namespaces": workers,
        "service_type": service_type,
        "cpu_request": cpu_request,
        "cpu_limit": _optional(cpu_limit),
        "memory_request": memory_request,
        "memory_limit": _optional(memory_limit),
        "image_pull_secrets": tuple(image_pull_secret or ()),
    }
    try:
        options = ManifestOptions(**values)
    except ValidationError as exc:
        raise _fail(_option_errors(exc)) from None
    try:
        objects = render(options, raw, worker_image=worker_image)
    except ManifestError as exc:
        where = f"{config}: " if config is not None else ""
        raise _fail(f"{where}{exc}") from None
    text = to_yaml(objects)
    if output is None:
        typer.echo(text, nl=False)
    else:
        output.write_text(text, encoding="utf-8")
        err.print(f"wrote {len(objects)} objects to {output}", markup=False)
    for note in _notes(options, starter=config is None, worker_image=worker_image):
        err.print(f"note: {note}", markup=False)
    err.print(
        "\n".join(setup_commands(options, str(output) if output else "FILE  # the YAML printed above")), markup=False
    )


def _read_config(path: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """The config file parsed, after the checks ``levers9 config check`` makes, and each local_k8s pool's namespace."""
    from levers9.config.load import ConfigError, load_config
    from levers9.config.yaml_source import as_mapping, load_yaml
    from levers9.hooks.errors import PluginLoadError

    try:
        loaded = load_config(path)
    except (ConfigError, PluginLoadError) as exc:
        raise _fail(str(exc)) from None
    try:
        namespaces: dict[str, str] = {}
        for name, pool in loaded.pools.items():
            if pool.provider != "local_k8s":
                continue
            namespaces[name] = str(pool.settings.namespace)
            kubeconfig = pool.settings.kubeconfig
            if kubeconfig not in (None, "in-cluster"):
                err.print(
                    f"note: pools.{name}.settings.kubeconfig names a file, which the controlplane's pods do "
                    "not have; 'in-cluster' uses their ServiceAccount",
                    markup=False,
                )
    finally:
        loaded.hooks.close()
    data, _ = load_yaml(path.read_text(encoding="utf-8"), str(path))
    return dict(as_mapping(data, str(path))), namespaces


def _notes(options: ManifestOptions, *, starter: bool, worker_image: str | None) -> list[str]:
    """What the operator should know of the choices made (``starter``: no config given, the starter one used)."""
    notes = []
    if options.replicas == 1:
        notes.append(
            "one replica: when its pod or node goes, everyone's work waits for Kubernetes to start "
            "another; two or more replicas fail over"
        )
    if options.tls_secret is None:
        notes.append(
            "no --tls-secret: the controlplane serves plain text (listen.plaintext), so tokens cross the "
            "cluster's network in clear; give a TLS Secret unless that network is private end to end"
        )
    if not options.workers_in:
        notes.append("the config has no local_k8s pool: no Role or ClusterRole, and the pods get no API token")
    images = [options.image]
    if starter:
        from levers9.images.worker import default_tag

        images.append(worker_image or default_tag())
        notes.append(
            f"the starter config has one local_k8s CPU pool whose workers run {images[-1]}, for the "
            "workspace 'default' alone (its process runtime isolates nothing); write your own config and "
            "pass it with --config"
        )
    notes.append(f"{' and '.join(images)} must be in a registry the cluster's nodes pull from")
    return notes


@app.command("write-config")
def write_config(
    template: Path = typer.Option(..., "--template", dir_okay=False, help="The config file the ConfigMap holds."),
    output: Path = typer.Option(..., "--output", dir_okay=False, help="Where the server reads the complete file."),
) -> None:
    """Add $LEVERS9_DATABASE_URL and $LEVERS9_REDIS_URL to the config and write it (the pods' init container)."""
    from levers9.files import write_atomic
    from levers9.kubernetes_manifests import ManifestError
    from levers9.kubernetes_manifests.pod_config import fill_state

    command = "levers9 kubernetes write-config"
    try:
        text = template.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise _fail(f"--template {template}: cannot read it: {exc}", command) from None
    try:
        filled = fill_state(text, os.environ, str(template))
    except ManifestError as exc:
        raise _fail(str(exc), command) from None
    try:
        write_atomic(output, filled, mode=0o600, durable=True)
    except OSError as exc:
        raise _fail(f"--output {output}: cannot write it: {exc}", command) from None
    err.print(f"wrote {output} from {template}", markup=False)
