"""The ``ec2`` provider's hooks: offers from the EC2 catalog, one RunInstances per worker, tags to find them again.

Every call goes to the region it concerns: offers and listing to each of the
pool's regions (``pool.regions``), provision to the request's region (the
offer's), terminate to the machine's own region (``provider_data["region"]``,
else ``machine.region``, else the pool's first region). Clients come from
:class:`levers9_ec2.session.Clients` (thread-safe, one per credentials, region
and endpoint); describe answers from :class:`levers9_ec2.offers.DescribeCache`.

* offers: :mod:`levers9_ec2.offers`;
* provision: :mod:`levers9_ec2.launch` (idempotent per machine id through
  ``ClientToken``; SDK retries off; an answer that never came is asked again
  with the same token, within :data:`PROVISION_BUDGET_S`);
* terminate: ``TerminateInstances``; ``InvalidInstanceID.NotFound`` or
  ``.Malformed`` (an instance aged out of the API, an id EC2 never issued)
  is success, as is terminating a terminated instance (EC2 says so itself);
* list: ``DescribeInstances`` filtered on the ``levers9:pool`` tag and the
  live states (pending, running, shutting-down, stopping, stopped), mapped by
  :mod:`levers9_ec2.machines`;
* check: STS ``GetCallerIdentity`` and one page of
  ``DescribeInstanceTypeOfferings`` in the pool's first region, and that each
  of the pool's regions has a certificate to verify its instances' identity
  with; what an operator can fix (credentials, permissions, an unset
  variable, a missing certificate) is ``ok=False`` with a hint, never a secret;
* verify identity: :func:`levers9_ec2.identity.verify_identity` against the
  machine's region (no API call);
* machine identity (on the worker, not the controlplane): the instance's
  signed identity document from IMDSv2 (:func:`levers9_ec2.identity.fetch_identity`).

:class:`Ec2Provider` is the plugin itself: the entry point names its one
instance (``levers9_ec2.plugin``), whose ``levers9_*`` methods are the hooks.
A pool's settings reach them as :class:`Ec2Settings` (``settings_of``; a pool
holding another provider's settings is ``InvalidRequest`` naming it).

Every EC2 failure is translated by :mod:`levers9_ec2.errors` with a message
naming the pool, region, instance type and zone
(:func:`levers9.clouds.calls.typed_call`); one it does not know propagates
unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

from levers9.clouds.calls import raise_typed, typed_call
from levers9.hooks.errors import AuthenticationFailed, InvalidRequest, PermissionDenied, ProviderError
from levers9.hooks.markers import hookimpl
from levers9.hooks.provider import ProviderPlugin
from levers9.hooks.types import GpuOffer, Machine, MachineIdentity, Pool, ProviderCheck, ProvisionRequest, settings_of
from levers9_ec2.errors import error_code, translate
from levers9_ec2.identity import fetch_identity, load_certificates, verify_identity
from levers9_ec2.launch import DEFAULT_ROOT_DEVICE, POOL_TAG, choose_subnet, launch, run_instances_params
from levers9_ec2.machines import machine_from_instance
from levers9_ec2.offers import (
    DescribeCache,
    GpuType,
    allowed_zones,
    build_offers,
    describe_gpu_types,
    describe_offerings,
    describe_subnet_zones,
    spot_prices,
    uses_spot,
)
from levers9_ec2.session import LAUNCH_CONNECT_TIMEOUT_S, LAUNCH_READ_TIMEOUT_S, Clients, credentials
from levers9_ec2.settings import Ec2Settings

__all__ = ["LIVE_STATES", "PROVIDER", "PROVISION_BUDGET_S", "Ec2Provider"]

PROVIDER = "ec2"
#: how long one provision may spend sending RunInstances (the core's deadline for the hook is 120 s)
PROVISION_BUDGET_S = 100.0
#: the instance states the listing asks for (terminated instances are left out)
LIVE_STATES = ("pending", "running", "shutting-down", "stopping", "stopped")
_GONE = frozenset({"InvalidInstanceID.NotFound", "InvalidInstanceID.Malformed"})

T = TypeVar("T")


def _regions(pool: Pool) -> list[str]:
    regions = list(pool.regions) or ([pool.region] if pool.region else [])
    if not regions:
        raise InvalidRequest(f"pool {pool.name!r} names no region; give the pool a 'region' (or 'regions')")
    return regions


def _typed(where: str, call: Callable[[], T]) -> T:
    return typed_call(call, partial(translate, where=where))


class Ec2Provider(ProviderPlugin):
    """The ``ec2`` plugin: its hooks, and their state (the plugin context, the clients and the describe cache)."""

    #: the edition of the hook spec these hooks follow
    LEVERS9_SPEC_VERSION = 2
    settings_model = Ec2Settings

    def __init__(self, describe: DescribeCache | None = None) -> None:
        super().__init__()
        self.clients = Clients()
        #: describe answers; a cache may be shared by providers (keys carry credentials, endpoint and region)
        self.describe = describe or DescribeCache()

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        self.clients.close()
        self.describe.clear()

    # ------------------------------------------------------------------ helpers

    def _key(self, settings: Ec2Settings, pool: Pool, region: str, *what: Any) -> tuple[Any, ...]:
        creds = credentials(settings, pool.name)
        return (*creds.cache_key(), str(settings.endpoint_url or ""), region, *what)

    def _gpu_types(self, client: Any, settings: Ec2Settings, pool: Pool, region: str) -> list[GpuType]:
        key = self._key(settings, pool, region, "types", tuple(settings.instance_types))
        return self.describe.get(key, lambda: describe_gpu_types(client, list(settings.instance_types)))

    def _subnet_zones(self, client: Any, settings: Ec2Settings, pool: Pool, region: str) -> dict[str, str]:
        key = self._key(settings, pool, region, "subnets", tuple(settings.subnet_ids))
        return self.describe.get(key, lambda: describe_subnet_zones(client, list(settings.subnet_ids)))

    def _root_device(self, client: Any, settings: Ec2Settings, pool: Pool, region: str) -> str:
        if settings.ami is None:
            return DEFAULT_ROOT_DEVICE
        ami = settings.ami

        def ask() -> str:
            images = client.describe_images(ImageIds=[ami]).get("Images", [])
            if not images:
                raise InvalidRequest(f"pool {pool.name!r}: AMI {ami} is not found in {region}", code="InvalidAMIID")
            return str(images[0].get("RootDeviceName") or DEFAULT_ROOT_DEVICE)

        return self.describe.get(self._key(settings, pool, region, "root-device", ami), ask)

    # ------------------------------------------------------------------ offers

    @hookimpl
    def levers9_gpu_offers(self, pool: Pool) -> list[GpuOffer]:
        if pool.gpu is None:
            return []
        settings = settings_of(pool, Ec2Settings)
        spot = uses_spot(pool, settings)
        offers: list[GpuOffer] = []
        for region in _regions(pool):
            where = f"listing {pool.gpu_count}x{pool.gpu} offers of pool {pool.name!r} in {region}"
            found: list[GpuOffer] = _typed(where, partial(self._region_offers, pool, settings, region, spot))
            offers.extend(found)
        return offers

    def _region_offers(self, pool: Pool, settings: Ec2Settings, region: str, spot: bool) -> list[GpuOffer]:
        client = self.clients.ec2(settings, pool.name, region)
        types = self._gpu_types(client, settings, pool, region)
        fitting = sorted(t.instance_type for t in types if t.gpu == pool.gpu and t.gpu_count == pool.gpu_count)
        if not fitting:
            return []
        key = self._key(settings, pool, region, "offerings", tuple(fitting))
        offerings = self.describe.get(key, lambda: describe_offerings(client, fitting))
        subnet_zones = self._subnet_zones(client, settings, pool, region) if settings.subnet_ids else None
        zones = allowed_zones(settings, region, subnet_zones)
        prices = spot_prices(client, fitting) if spot else None
        return build_offers(pool, region, types, offerings, zones, spot, prices)

    # ------------------------------------------------------------------ provision

    @hookimpl
    def levers9_provision(self, request: ProvisionRequest) -> Machine:
        started = time.monotonic()
        pool = request.pool
        settings = settings_of(pool, Ec2Settings)
        offer = request.offer
        region = request.region or (offer.region if offer else None) or _regions(pool)[0]
        instance_type = (offer.instance_type if offer else None) or (
            settings.instance_types[0] if settings.instance_types else None
        )
        if instance_type is None:
            raise InvalidRequest(
                f"pool {pool.name!r}: nothing to launch in {region}: no offer was chosen and the settings name "
                "no instance_types"
            )
        zone = offer.zone if offer else None
        spot = offer.spot if offer else uses_spot(pool, settings)
        where = f"launching {instance_type} in {zone or region} for pool {pool.name!r} (region {region})"
        client = _typed(where, lambda: self.clients.ec2(settings, pool.name, region))
        subnet_id: str | None = None
        if settings.subnet_ids:
            subnet_zones = _typed(where, lambda: self._subnet_zones(client, settings, pool, region))
            subnet_id = choose_subnet(subnet_zones, zone, request.machine_id)
            if subnet_id is None:
                raise InvalidRequest(
                    f"{where}: none of the pool's subnet_ids is in {zone or region}; add a subnet of that zone "
                    "or leave the zone out of availability_zones",
                    code="InvalidSubnetID.NotFound",
                )
        root_device = _typed(where, lambda: self._root_device(client, settings, pool, region))
        params = run_instances_params(
            request,
            settings,
            instance_type=instance_type,
            zone=zone,
            subnet_id=subnet_id,
            root_device=root_device,
            spot=spot,
        )
        launcher = _typed(where, lambda: self.clients.ec2(settings, pool.name, region, launch=True))
        attempt_s = LAUNCH_CONNECT_TIMEOUT_S + LAUNCH_READ_TIMEOUT_S
        instance = _typed(where, lambda: launch(launcher, params, started + PROVISION_BUDGET_S, attempt_s))
        machine = machine_from_instance(pool, region, instance)
        return machine.model_copy(
            update={
                "machine_id": request.machine_id,
                "gpu": offer.gpu if offer else pool.gpu,
                "gpu_count": offer.gpu_count if offer else pool.gpu_count,
                "instance_type": machine.instance_type or instance_type,
            }
        )

    # ------------------------------------------------------------------ terminate, list

    @hookimpl
    def levers9_terminate(self, pool: Pool, machine: Machine) -> None:
        settings = settings_of(pool, Ec2Settings)
        region = str(machine.provider_data.get("region") or machine.region or _regions(pool)[0])
        where = f"terminating {machine.provider_id} of pool {pool.name!r} in {region}"
        client = _typed(where, lambda: self.clients.ec2(settings, pool.name, region))
        try:
            client.terminate_instances(InstanceIds=[machine.provider_id])
        except Exception as exc:
            if error_code(exc) in _GONE:
                return
            raise_typed(exc, partial(translate, where=where))

    @hookimpl
    def levers9_list_machines(self, pool: Pool) -> list[Machine]:
        settings = settings_of(pool, Ec2Settings)
        machines: list[Machine] = []
        filters = [
            {"Name": f"tag:{POOL_TAG}", "Values": [pool.name]},
            {"Name": "instance-state-name", "Values": list(LIVE_STATES)},
        ]
        for region in _regions(pool):
            where = f"listing the machines of pool {pool.name!r} in {region}"

            def describe(region: str = region) -> list[Machine]:
                client = self.clients.ec2(settings, pool.name, region)
                found: list[Machine] = []
                for page in client.get_paginator("describe_instances").paginate(Filters=filters):
                    for reservation in page.get("Reservations", []):
                        for instance in reservation.get("Instances", []):
                            found.append(machine_from_instance(pool, region, instance))
                return found

            machines.extend(_typed(where, describe))
        return machines

    # ------------------------------------------------------------------ identity

    @hookimpl
    def levers9_verify_identity(self, pool: Pool, machine: Machine, identity: MachineIdentity | None) -> None:
        """Accept a joining worker only with the signed identity document of ``machine`` (unless the pool opts out)."""
        settings = settings_of(pool, Ec2Settings)
        if settings.instance_identity == "off":
            return
        region = str(machine.provider_data.get("region") or machine.region or _regions(pool)[0])
        verify_identity(machine, identity, region, settings.identity_certificate_file)

    @hookimpl
    def levers9_machine_identity(self) -> MachineIdentity:
        """On a worker of an EC2 instance: the instance's signed identity document, from IMDSv2."""
        return fetch_identity()

    # ------------------------------------------------------------------ check

    @hookimpl
    def levers9_check(self, pool: Pool) -> ProviderCheck:
        settings = settings_of(pool, Ec2Settings)
        region = _regions(pool)[0]
        where = f"checking pool {pool.name!r} in {region}"
        try:
            creds = credentials(settings, pool.name)
            sts = _typed(where, lambda: self.clients.sts(settings, pool.name, region))
            arn = _typed(where, lambda: str(sts.get_caller_identity().get("Arn", "?")))
            ec2 = _typed(where, lambda: self.clients.ec2(settings, pool.name, region))
            _typed(
                where,
                lambda: ec2.describe_instance_type_offerings(LocationType="availability-zone", MaxResults=5),
            )
        except (AuthenticationFailed, PermissionDenied, InvalidRequest) as exc:
            return ProviderCheck(ok=False, message=str(exc), hint=_hint(exc, settings))
        identity = _identity_check(pool, settings)
        if identity is not None:
            return ProviderCheck(ok=False, message=identity, hint=_IDENTITY_HINT)
        return ProviderCheck(
            ok=True,
            message=f"credentials of {creds.describe} accepted as {arn} in {region}; instance type offerings readable",
        )


_IDENTITY_HINT = (
    "set the pool's identity_certificate_file to the region's RSA certificate from "
    "https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/regions-certs.html, or instance_identity: off"
)


def _identity_check(pool: Pool, settings: Ec2Settings) -> str | None:
    """What stops workers of ``pool`` from proving their instances, if anything (no certificate for a region)."""
    if settings.instance_identity == "off" or settings.identity_certificate_file is not None:
        return None
    known = load_certificates()
    missing = [r for r in _regions(pool) if r not in known]
    if not missing:
        return None
    return (
        f"pool {pool.name!r}: the ec2 plugin ships no AWS identity certificate for {', '.join(missing)}, so its "
        "workers' instance identity documents cannot be verified and they would be refused"
    )


def _hint(exc: ProviderError, settings: Ec2Settings) -> str:
    code = exc.code or ""
    if code == "CredentialVariableUnset":
        return "export the variable in the controlplane's environment, or name a 'profile' in the pool's settings"
    if code == "NoCredentialsError":
        return (
            "set 'profile' or 'access_key_id_env'/'secret_access_key_env' in the pool's settings, or run the "
            "controlplane with an instance role"
        )
    if code == "ProfileNotFound":
        return f"add profile {settings.profile!r} to the AWS config files, or fix 'profile' in the pool's settings"
    if code == "OptInRequired":
        return "enable the region for the account (AWS console, Account settings, AWS Regions)"
    if isinstance(exc, PermissionDenied):
        return "grant the credentials ec2:DescribeInstanceTypeOfferings (and the other ec2 actions levers9 uses)"
    if isinstance(exc, AuthenticationFailed):
        where = f"profile {settings.profile!r}" if settings.profile else "the keys the pool's variables hold"
        return f"AWS rejected {where}: check them with `aws sts get-caller-identity`; they may be wrong or expired"
    return "fix the pool's settings and run `levers9 check` again"
