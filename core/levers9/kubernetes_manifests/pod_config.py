"""The levers9 config file as the controlplane's pods run it: kept in a ConfigMap, completed from Secrets at start.

The config file has no way to read a value from the environment for
``state.database_url`` and ``state.redis_url`` (only the secret key has one,
``LEVERS9_SECRET_KEY``). So the file goes into the ConfigMap *without* them
(:func:`pod_config`), and each pod's init container runs ``levers9 kubernetes
write-config``, which adds them from :data:`DATABASE_URL_ENV` and
:data:`REDIS_URL_ENV` (given to it from the Secrets) and writes the complete
file, mode 0600, to a memory-backed volume the server reads
(:func:`fill_state`). The URLs therefore exist only in the Secrets and in that
file inside the pod.

:func:`pod_config` adapts the operator's file to the pod: the data directory is
the pod's volume, every listener binds the pod's address, TLS comes from the
TLS Secret when there is one (plain text otherwise, which the file must then
allow), and workers are told to dial the gRPC Service unless the file says
where. It refuses, naming the field, what cannot hold in a pod: a database or
Redis URL or a secret key file in the file (they belong in Secrets), a
``listen.tls`` (its files are the TLS Secret's), another data directory, a
loopback ``listen.host``. Failures raise :class:`ManifestError`; none repeats a
URL, which may hold a password.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import ValidationError

from levers9.config.model import Config, StateConfig
from levers9.config.yaml_source import YamlSyntaxError, as_mapping, load_yaml
from levers9.kubernetes_manifests.options import ManifestError, ManifestOptions

__all__ = [
    "CONFIG_FILE",
    "DATABASE_URL_ENV",
    "DATA_DIR",
    "DATA_MOUNT",
    "REDIS_URL_ENV",
    "TEMPLATE_FILE",
    "TLS_DIR",
    "PodConfig",
    "default_config",
    "fill_state",
    "pod_config",
]

#: where the ConfigMap is mounted (the file without the URLs)
TEMPLATE_DIR = "/etc/levers9"
TEMPLATE_FILE = f"{TEMPLATE_DIR}/levers9.yaml"
#: where the init container writes the complete file (a memory-backed emptyDir) and the server reads it
CONFIG_DIR = "/run/levers9"
CONFIG_FILE = f"{CONFIG_DIR}/levers9.yaml"
#: where the pod's emptyDir is mounted (nothing in it outlives the pod; the record is in PostgreSQL), and the data
#: directory levers9 makes in it: its own, 0700 (the volume itself belongs to root and is open to the pod's group)
DATA_MOUNT = "/var/lib/levers9"
DATA_DIR = f"{DATA_MOUNT}/data"
#: where the TLS Secret is mounted
TLS_DIR = "/etc/levers9-tls"
#: the variables the init container reads the URLs from
DATABASE_URL_ENV = "LEVERS9_DATABASE_URL"
REDIS_URL_ENV = "LEVERS9_REDIS_URL"
#: the keys of the Secrets the options name
URL_KEY = "url"
SECRET_KEY_KEY = "key"
#: the first lines of the ConfigMap's file
HEADER = (
    "# levers9 config of the controlplane on Kubernetes, written by `levers9 kubernetes manifests`.\n"
    "# state.database_url and state.redis_url are not here: each pod's init container adds them from the\n"
    f"# Secrets and writes the complete file to {CONFIG_FILE}, which the server reads.\n"
)
#: the listen hosts that reach the pod's own address
_ANY_ADDRESS = ("0.0.0.0", "::")


@dataclass(frozen=True)
class PodConfig:
    """The config the ConfigMap holds, and what the manifests need to know of it."""

    data: dict[str, Any]
    grpc_port: int
    http_port: int
    metrics_port: int
    #: the listeners serve TLS (from the TLS Secret)
    tls: bool

    def text(self) -> str:
        """The file as the ConfigMap holds it: :data:`HEADER`, then the YAML."""
        return HEADER + yaml.safe_dump(self.data, sort_keys=False, default_flow_style=False)

    def digest(self) -> str:
        """sha256 of :meth:`text`: on the pod template, so a changed config rolls the replicas."""
        return hashlib.sha256(self.text().encode()).hexdigest()


def default_config(worker_namespace: str, worker_image: str) -> dict[str, Any]:
    """A config with one CPU pool of ``local_k8s`` workers, to start from; replace it with your own file.

    The worker image runs calls on the ``process`` runtime, which isolates nothing between them, so the pool
    serves one workspace, ``default`` (the one ``levers9 token create`` gives a token without ``--workspace``).
    """
    return {
        "version": 1,
        "pools": {
            "k8s-cpu": {
                "provider": "local_k8s",
                "runtime": "process",
                "workspace": "default",
                "cpu": 1,
                "memory": "2GiB",
                "min_workers": 0,
                "max_workers": 4,
                "settings": {
                    "namespace": worker_namespace,
                    "kubeconfig": "in-cluster",
                    "worker_image": worker_image,
                },
            }
        },
    }


def _section(data: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = data.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ManifestError(f"{key}: must be a mapping, not {type(value).__name__}")
    return dict(value)


def pod_config(config: Mapping[str, Any], options: ManifestOptions, grpc_service: str) -> PodConfig:
    """``config`` (the operator's file, parsed) adapted to run in the pods; ``grpc_service`` is the gRPC Service."""
    data = copy.deepcopy(dict(config))
    state = _section(data, "state")
    for key, where in (
        ("database_url", options.database_secret),
        ("redis_url", options.redis_secret),
        ("secret_key_file", options.secret_key_secret),
    ):
        if state.get(key) is not None:
            raise ManifestError(
                f"state.{key}: remove it from the config; on Kubernetes it comes from the Secret {where!r}, "
                "so that it never appears in a manifest"
            )
    if data.get("data_dir") not in (None, DATA_DIR):
        raise ManifestError(f"data_dir: remove it; on Kubernetes the data directory is {DATA_DIR}, on the pod's volume")
    data["data_dir"] = DATA_DIR
    listen = _section(data, "listen")
    if listen.get("tls") is not None:
        raise ManifestError("listen.tls: remove it; on Kubernetes give the TLS Secret's name (--tls-secret)")
    host = listen.setdefault("host", _ANY_ADDRESS[0])
    if host not in _ANY_ADDRESS:
        raise ManifestError(
            f"listen.host: {host!r} does not reach the pod from the Services; remove it (the pod binds 0.0.0.0)"
        )
    if options.tls_secret is not None:
        tls = {"cert_file": f"{TLS_DIR}/tls.crt", "key_file": f"{TLS_DIR}/tls.key"}
        if options.tls_ca:
            tls["ca_file"] = f"{TLS_DIR}/ca.crt"
        listen["tls"] = tls
    else:
        listen["plaintext"] = True  # the server refuses plain text on 0.0.0.0 without it
    try:
        checked = Config.model_validate({**data, "listen": listen})
    except ValidationError as exc:
        raise ManifestError(f"the config is not valid: {_errors(exc)}") from None
    ports = checked.listen
    if not listen.get("advertise"):
        scheme = "grpcs" if options.tls_secret is not None else "grpc"
        listen["advertise"] = [f"{scheme}://{grpc_service}.{options.namespace}.svc:{ports.grpc_port}"]
    # what the pod decides first, then the operator's sections in their order
    ordered = {"version": data.pop("version", 1), "data_dir": data.pop("data_dir"), "listen": listen}
    data.pop("listen", None)
    ordered.update(data)
    return PodConfig(ordered, ports.grpc_port, ports.http_port, ports.metrics_port, options.tls_secret is not None)


def _errors(exc: ValidationError) -> str:
    """The errors of ``exc`` by field, without the input values (a URL may hold a password)."""
    return "; ".join(
        f"{'.'.join(str(p) for p in error['loc'])}: {error['msg']}" for error in exc.errors(include_input=False)
    )


def fill_state(template: str, environ: Mapping[str, str], source: str = TEMPLATE_FILE) -> str:
    """The complete config: ``template`` (the ConfigMap's file) with the URLs from ``environ`` in ``state``.

    Raises :class:`ManifestError` naming the variable when one is unset or not a URL of its kind, or when
    the template is not a valid config; the URLs are never repeated.
    """
    try:
        data, _ = load_yaml(template, source)
        mapping = dict(as_mapping(data, source))
    except YamlSyntaxError as exc:
        raise ManifestError(str(exc)) from None
    urls: dict[str, str] = {}
    for key, variable, what, example in (
        ("database_url", DATABASE_URL_ENV, "PostgreSQL", "postgresql+psycopg://USER:PASSWORD@HOST/DB"),
        ("redis_url", REDIS_URL_ENV, "Redis", "redis://:PASSWORD@HOST:6379/0"),
    ):
        value = environ.get(variable, "").strip()
        if not value:
            raise ManifestError(
                f"${variable} is not set: the Deployment gives it from a Secret's key {URL_KEY!r} ({example})"
            )
        if key == "database_url" and value.startswith("sqlite"):
            raise ManifestError(
                f"${variable} names a SQLite database, which only one pod could use; give a PostgreSQL URL ({example})"
            )
        try:
            StateConfig.model_validate({key: value})
        except ValidationError:
            raise ManifestError(f"${variable} is not a {what} URL like {example} (its value is not shown)") from None
        urls[key] = value
    mapping["state"] = {**_section(mapping, "state"), **urls}
    try:
        Config.model_validate(mapping)
    except ValidationError as exc:
        raise ManifestError(f"{source}: the config is not valid: {_errors(exc)}") from None
    header = f"# written by `levers9 kubernetes write-config` from {source} and the Secrets' URLs; not to be edited\n"
    return header + yaml.safe_dump(mapping, sort_keys=False, default_flow_style=False)
