"""Fake clouds that speak each provider's documented API at the wire, so the real SDKs run unchanged against them.

One module per cloud (``ec2_cloud``: a real moto server behind a fault-injecting
proxy; ``oci_cloud`` and ``lambda_cloud``: HTTP servers written from the
providers' API references). Each fake also answers :meth:`instances` with what
a test (and the emulated-boot harness, which boots every running instance's
user data) needs to see: every instance it holds, its state, its tags and the
user data it was launched with.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["CloudInstance"]


@dataclass(frozen=True)
class CloudInstance:
    """One instance a fake cloud holds, as a test sees it (not as the API reports it)."""

    #: the provider's id (``i-0123…``, an OCI instance OCID, a Lambda instance id)
    id: str
    #: the provider's own state word (``pending``, ``running``, ``RUNNING``, ``active``, ``terminated``…)
    state: str
    #: True while the instance would be booted and running its user data on a real cloud
    running: bool
    #: True once it is terminated (or terminating): gone for the purpose of "nothing left behind"
    gone: bool
    #: the user data it was launched with, decoded to text ("" when none)
    user_data: str = ""
    #: its tags (EC2 tags, OCI freeform tags, Lambda tags), flattened to one mapping
    tags: dict[str, str] = field(default_factory=dict)
    #: the instance type or shape, and where it is (region, zone or availability domain)
    instance_type: str | None = None
    region: str | None = None
    zone: str | None = None
