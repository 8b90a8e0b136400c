"""What an operator decides about levers9 on Kubernetes: :class:`ManifestOptions`, checked before anything renders.

Invariants:

* **Names only, never values.** The database URL, the Redis URL, the secret key
  and the TLS files are named by the Secrets that hold them; no option takes a
  credential, so none can end up in a manifest.
* **Kubernetes' own syntax.** Namespaces are DNS-1123 labels and Secret names
  DNS-1123 subdomains, checked here with the API server's rules, so a typo fails
  when the command runs rather than as a 422 from ``kubectl apply``.
* **Sizes as levers9 writes them.** CPU as cores or millicores (``0.5``,
  ``500m``) and memory as ``1Gi`` or ``1024`` (MiB), parsed by
  :mod:`levers9.quantities`; a request above its limit is refused.

A bad option raises pydantic's ``ValidationError`` whose location is the field
name (``replicas``, ``namespace``...): the command maps each field to its flag
(:data:`FLAGS`) so the message names what to change.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal, Self

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from levers9.config.fields import ImageRef
from levers9.quantities import parse_cpu_millicores, parse_memory_mib

__all__ = [
    "FLAGS",
    "DnsLabel",
    "ManifestError",
    "ManifestOptions",
    "SecretName",
]

#: RFC 1123 label: namespaces
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
#: RFC 1123 subdomain: Secret names
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


class ManifestError(ValueError):
    """The options or the config cannot become manifests; the message names the option or config field."""


def _dns_label(value: str) -> str:
    if len(value) > 63 or _DNS_LABEL.fullmatch(value) is None:
        raise ValueError(
            f"{value!r} is not a DNS-1123 label (lowercase letters, digits and '-', starting and ending with a "
            "letter or digit, at most 63 characters)"
        )
    return value


def _secret_name(value: str) -> str:
    # the value is not repeated: a pasted credential is the usual mistake here
    if len(value) > 253 or _DNS_SUBDOMAIN.fullmatch(value) is None:
        raise ValueError(
            "not the name of a Secret (a DNS-1123 subdomain: lowercase letters, digits, '-' and '.'); give the "
            "Secret's name, never its contents"
        )
    return value


def _millicores(value: object) -> int:
    return parse_cpu_millicores(value, field=None)


def _mib(value: object) -> int:
    return parse_memory_mib(value, field=None)


DnsLabel = Annotated[str, AfterValidator(_dns_label)]
SecretName = Annotated[str, AfterValidator(_secret_name)]
Millicores = Annotated[int, BeforeValidator(_millicores)]
MiB = Annotated[int, BeforeValidator(_mib)]


class ManifestOptions(BaseModel):
    """Everything ``levers9 kubernetes manifests`` renders from, besides the levers9 config file."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    namespace: DnsLabel = Field("levers9", description="Namespace of the controlplane (created by the manifests).")
    replicas: int = Field(
        2,
        ge=1,
        description="Controlplane replicas. Two or more give failover: one pod or node lost stops no one's work. "
        "One replica is a single point of failure.",
    )
    image: ImageRef = Field(
        description="Image the controlplane runs `levers9 server` from, pushed to a registry the cluster pulls "
        "from. It needs levers9 with the postgres and k8s extras."
    )
    image_pull_secrets: tuple[SecretName, ...] = Field(
        (), description="docker-registry Secrets (names) in the namespace, for a private registry."
    )
    database_secret: SecretName = Field(
        "levers9-database", description="Secret whose key 'url' is the PostgreSQL URL (postgresql+psycopg://...)."
    )
    redis_secret: SecretName = Field("levers9-redis", description="Secret whose key 'url' is the Redis URL.")
    secret_key_secret: SecretName = Field(
        "levers9-secret-key", description="Secret whose key 'key' holds the Fernet key(s) that encrypt secrets."
    )
    tls_secret: SecretName | None = Field(
        None,
        description="Secret with 'tls.crt' and 'tls.key' (cert-manager writes such Secrets): every listener serves "
        "TLS with it. None: plain text, for a cluster network you trust end to end.",
    )
    tls_ca: bool = Field(True, description="The TLS Secret also holds 'ca.crt', handed to the workers levers9 starts.")
    worker_namespaces: tuple[DnsLabel, ...] | None = Field(
        None,
        description="Namespaces where the local_k8s provider creates worker Jobs and Secrets: each gets a Role. "
        "None: the controlplane's namespace. Empty: no local_k8s pool, so no Role or ClusterRole.",
    )
    service_type: Literal["ClusterIP", "LoadBalancer"] = Field(
        "ClusterIP", description="Type of the gRPC and HTTP Services."
    )
    cpu_request: Millicores = Field(500, description="CPU each replica requests, in millicores (or '0.5', '500m').")
    cpu_limit: Millicores | None = Field(None, description="CPU limit of each replica; None: no limit.")
    memory_request: MiB = Field(1024, description="Memory each replica requests, in MiB (or '1Gi').")
    memory_limit: MiB | None = Field(2048, description="Memory limit of each replica, in MiB; None: no limit.")

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.cpu_limit is not None and self.cpu_limit < self.cpu_request:
            raise ValueError(
                f"cpu_limit ({self.cpu_limit}m) is below cpu_request ({self.cpu_request}m); Kubernetes refuses that"
            )
        if self.memory_limit is not None and self.memory_limit < self.memory_request:
            raise ValueError(
                f"memory_limit ({self.memory_limit}Mi) is below memory_request ({self.memory_request}Mi); "
                "Kubernetes refuses that"
            )
        if self.service_type == "LoadBalancer" and self.tls_secret is None:
            raise ValueError(
                "service_type LoadBalancer without tls_secret would put tokens on a network outside the cluster "
                "in plain text; give a TLS Secret"
            )
        if len(set(self.image_pull_secrets)) != len(self.image_pull_secrets):
            raise ValueError("image_pull_secrets names the same Secret twice")
        return self

    @property
    def workers_in(self) -> tuple[str, ...]:
        """The worker namespaces, each once, in the order given (the controlplane's namespace when unset)."""
        names = (self.namespace,) if self.worker_namespaces is None else self.worker_namespaces
        return tuple(dict.fromkeys(names))


#: each option's flag on ``levers9 kubernetes manifests``, so an error names what the operator typed
FLAGS: dict[str, str] = {
    "namespace": "--namespace",
    "replicas": "--replicas",
    "image": "--image",
    "image_pull_secrets": "--image-pull-secret",
    "database_secret": "--database-secret",
    "redis_secret": "--redis-secret",
    "secret_key_secret": "--secret-key-secret",
    "tls_secret": "--tls-secret",
    "tls_ca": "--tls-ca/--no-tls-ca",
    "worker_namespaces": "--worker-namespace",
    "service_type": "--service-type",
    "cpu_request": "--cpu-request",
    "cpu_limit": "--cpu-limit",
    "memory_request": "--memory-request",
    "memory_limit": "--memory-limit",
}
