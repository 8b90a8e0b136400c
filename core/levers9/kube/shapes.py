"""Kubernetes shapes a pool's settings name: DNS names, label keys and values, resource names, tolerations.

Everything here validates with the rules the Kubernetes API server applies
(label syntax, toleration rules, DNS names), so a typo fails when the config is
loaded rather than as a 422 at provisioning time. The ``local_k8s`` and
``attached_cluster`` settings are built from these, so the two providers
validate pod placement identically. Only pydantic is imported.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

__all__ = ["DnsLabel", "DnsSubdomain", "NodeSelector", "ResourceName", "SecretName", "Toleration"]

# --------------------------------------------------------------------------- Kubernetes name syntax

#: RFC 1123 label: namespaces, most object names
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
#: RFC 1123 subdomain: Secret, ServiceAccount and PriorityClass names, label-key prefixes
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
#: the name part of a label key, and a non-empty label value
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def _check_dns_label(value: str) -> str:
    if len(value) > 63 or not _DNS_LABEL.match(value):
        raise ValueError(
            f"{value!r} is not a valid DNS-1123 label (lowercase letters, digits and '-', "
            "starting and ending with a letter or digit, at most 63 characters)"
        )
    return value


def _check_dns_subdomain(value: str) -> str:
    if len(value) > 253 or not _DNS_SUBDOMAIN.match(value):
        raise ValueError(
            f"{value!r} is not a valid DNS-1123 subdomain (lowercase letters, digits, '-' and '.', "
            "at most 253 characters)"
        )
    return value


def _check_label_key(value: str) -> str:
    prefix, slash, name = value.rpartition("/")
    if slash and not prefix:
        raise ValueError(f"label key {value!r} has an empty prefix before '/'")
    if prefix:
        _check_dns_subdomain(prefix)
    if len(name) > 63 or not _LABEL_NAME.match(name):
        raise ValueError(
            f"label key {value!r}: the name part must be 1-63 characters of letters, digits, '-', '_' "
            "or '.', starting and ending with a letter or digit"
        )
    return value


def _check_label_value(value: str) -> str:
    if value and (len(value) > 63 or not _LABEL_NAME.match(value)):
        raise ValueError(
            f"label value {value!r} must be empty or 1-63 characters of letters, digits, '-', '_' "
            "or '.', starting and ending with a letter or digit"
        )
    return value


def _check_secret_name(value: str) -> str:
    """The name of a Secret; the value is not echoed, since a pasted credential is the usual mistake."""
    if len(value) > 253 or not _DNS_SUBDOMAIN.match(value):
        raise ValueError(
            "not the name of a Secret (a DNS-1123 subdomain); give the name of an existing "
            "docker-registry Secret, never its contents"
        )
    return value


def _check_resource_name(value: str) -> str:
    """An extended resource name: it must carry a domain prefix, as ``nvidia.com/gpu`` does."""
    _check_label_key(value)
    prefix = value.rpartition("/")[0]
    if not prefix:
        raise ValueError(f"extended resource {value!r} needs a domain prefix, for example 'nvidia.com/gpu'")
    if prefix == "kubernetes.io" or prefix.endswith(".kubernetes.io"):
        raise ValueError(f"extended resource {value!r} may not use the reserved kubernetes.io prefix")
    return value


def _check_node_selector(value: dict[str, str]) -> dict[str, str]:
    for key, label_value in value.items():
        _check_label_key(key)
        _check_label_value(label_value)
    return value


DnsLabel = Annotated[str, AfterValidator(_check_dns_label)]
DnsSubdomain = Annotated[str, AfterValidator(_check_dns_subdomain)]
SecretName = Annotated[str, AfterValidator(_check_secret_name)]
ResourceName = Annotated[str, AfterValidator(_check_resource_name)]
NodeSelector = Annotated[dict[str, str], AfterValidator(_check_node_selector)]


class Toleration(BaseModel):
    """One pod toleration, validated with the API server's rules.

    ``operator: Exists`` takes no ``value``; an empty ``key`` matches every taint
    and so requires ``Exists``; ``toleration_seconds`` only means something for
    ``NoExecute`` taints.
    """

    model_config = ConfigDict(extra="forbid")

    key: str | None = Field(
        None,
        description="Taint key to tolerate, for example 'nvidia.com/gpu'. Empty means every key "
        "(then operator must be Exists).",
    )
    operator: Literal["Equal", "Exists"] = Field(
        "Equal", description="'Equal' matches key and value; 'Exists' matches any value of the key."
    )
    value: str | None = Field(None, description="Taint value to match; must be empty with operator Exists.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="Taint effect to match; empty matches every effect."
    )
    toleration_seconds: int | None = Field(
        None,
        ge=0,
        description="How long a NoExecute taint is tolerated before the pod is evicted; only with effect "
        "NoExecute. Empty tolerates it for ever.",
    )

    @model_validator(mode="after")
    def _api_rules(self) -> Self:
        if self.key:
            _check_label_key(self.key)
        elif self.operator != "Exists":
            raise ValueError("a toleration without a key must use operator 'Exists'")
        if self.operator == "Exists" and self.value:
            raise ValueError("a toleration with operator 'Exists' must not have a value")
        if self.value:
            _check_label_value(self.value)
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("toleration_seconds is only allowed with effect 'NoExecute'")
        return self
