"""The ``oci`` provider's hooks: offers from ListShapes, LaunchInstance, TerminateInstance, ListInstances.

:class:`OciProvider` is the plugin: the entry point names its one instance
(``levers9_oci.plugin``), whose ``levers9_*`` methods are the hooks, and it
holds their state: a :class:`~levers9_oci.clients.ClientCache` (clients per
thread, settings and region) and the context ``levers9_startup`` gave. Each
region of ``pool.regions`` gets its own clients; with no region, the SDK
profile's (or principal's) own. A pool's settings reach the hooks as
:class:`~levers9_oci.settings.OciSettings` (``settings_of``).

Invariants:

* **Tags.** Every instance carries the freeform tags ``levers9-machine-id``
  and ``levers9-pool`` (and the pool's own ``freeform_tags``); ListInstances
  has no tag filter, so :meth:`OciProvider.levers9_list_machines` matches
  ``levers9-pool`` itself and leaves out ``TERMINATED`` instances.
* **Lists follow every page** (:func:`levers9_oci.paging.all_pages`, not the
  SDK's pagination helper, which retries each page for minutes).
* **One launch call, idempotent.** ``launch_instance`` is called with
  ``opc_retry_token`` derived from ``request.machine_id`` and
  ``NoneRetryStrategy``: a capacity answer (500 "Out of host capacity") is
  raised after one call. When the call gets no answer (a reset connection, a
  read timeout) it is sent again with the same token, up to
  :data:`LAUNCH_ATTEMPTS` times and only while a whole attempt still fits in
  :data:`LAUNCH_BUDGET_S` (below the core's 120 s provision deadline); OCI
  answers a retried token with the instance the first call started: one
  machine per machine id, whichever attempt was answered. Out of attempts, it
  raises ``Throttled`` and the core's retry carries the same token.
* **provider_data** holds region, compartment and availability domain, so
  terminate and the reconciler reach the machine's own region from the record
  alone; ``Machine.region`` is the client's region name (OCI's
  ``Instance.region`` answers ``iad`` for us-ashburn-1, so it is not used).
* **Terminate is idempotent.** 404 ``NotAuthorizedOrNotFound`` (unknown or
  long gone), or a 409 for an instance already ``TERMINATING``/``TERMINATED``,
  is success; an id that is not an instance OCID cannot be OCI's and is
  success without a call.

What each failure means is :mod:`levers9_oci.errors`' table (applied to each
call through :func:`levers9.clouds.calls.typed_call`); the capacity
report behind offer availability is the one call whose failure is swallowed
(availability is then unknown).
"""

from __future__ import annotations

import base64
import hashlib
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from levers9.bootstrap import cloud_init
from levers9.clouds.calls import raise_typed, typed_call
from levers9.hooks.errors import AuthenticationFailed, InvalidRequest, PermissionDenied, ProviderError, Throttled
from levers9.hooks.markers import hookimpl
from levers9.hooks.provider import ProviderPlugin
from levers9.hooks.types import (
    Availability,
    GpuOffer,
    Machine,
    MachineState,
    Pool,
    ProviderCheck,
    ProvisionRequest,
    settings_of,
)
from levers9_oci.clients import CONNECT_TIMEOUT_S, READ_TIMEOUT_S, ClientCache, Clients
from levers9_oci.errors import is_service_error, translate
from levers9_oci.offers import availability_from_report, matching_shapes, shape_offer
from levers9_oci.paging import all_pages
from levers9_oci.settings import OciSettings

__all__ = ["LAUNCH_ATTEMPTS", "LAUNCH_BUDGET_S", "MACHINE_TAG", "POOL_TAG", "OciProvider"]

T = TypeVar("T")

#: levers9's freeform tags (the settings refuse keys with the ``levers9-`` prefix)
MACHINE_TAG = "levers9-machine-id"
POOL_TAG = "levers9-pool"
#: launches sent for one provision when the answer is lost, and how long they may take together
LAUNCH_ATTEMPTS = 3
LAUNCH_BUDGET_S = 90.0
#: first pause between two launches of the same token (doubled each time)
LAUNCH_BACKOFF_S = 0.5
#: OCI's limit on ``opc-retry-token``
RETRY_TOKEN_MAX = 64

_STATES = {
    "PROVISIONING": MachineState.PENDING,
    "STARTING": MachineState.PENDING,
    "RUNNING": MachineState.RUNNING,
    "MOVING": MachineState.RUNNING,
    "CREATING_IMAGE": MachineState.RUNNING,
    "STOPPING": MachineState.STOPPING,
    "TERMINATING": MachineState.STOPPING,
    "STOPPED": MachineState.FAILED,
    "TERMINATED": MachineState.TERMINATED,
}


def retry_token(machine_id: str) -> str:
    """The ``opc-retry-token`` of a machine: its id, or a digest of it when longer than OCI allows."""
    if len(machine_id) <= RETRY_TOKEN_MAX:
        return machine_id
    return hashlib.sha256(machine_id.encode()).hexdigest()[:RETRY_TOKEN_MAX]


class OciProvider(ProviderPlugin):
    """The ``oci`` plugin: its hooks, and the clients they share (see the module docstring)."""

    #: the edition of the hook spec these hooks follow
    LEVERS9_SPEC_VERSION = 2
    settings_model = OciSettings

    def __init__(self, *, sleep: Callable[[float], None] = time.sleep) -> None:
        super().__init__()
        self.clients = ClientCache()
        self._sleep = sleep

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        self.clients.close()

    # ------------------------------------------------------------------ helpers

    def _call(self, fn: Callable[[], T], *, doing: str, where: str) -> T:
        """Run one SDK call; raise the typed error its failure means (unknown failures propagate as they are)."""
        return typed_call(fn, partial(translate, doing=doing, where=where))

    def _regions(self, pool: Pool) -> list[str]:
        if pool.regions:
            return list(pool.regions)
        if pool.region:
            return [pool.region]
        return [self.clients.get(settings_of(pool, OciSettings), None).region]

    def _domains(self, clients: Clients, pool: Pool) -> list[str]:
        settings = settings_of(pool, OciSettings)
        if settings.availability_domains:
            return list(settings.availability_domains)
        answer = self._call(
            lambda: clients.identity.list_availability_domains(settings.compartment_id),
            doing="ListAvailabilityDomains",
            where=f"pool {pool.name!r} in {clients.region}",
        )
        return [d.name for d in answer.data]

    # ------------------------------------------------------------------ offers

    @hookimpl
    def levers9_gpu_offers(self, pool: Pool) -> list[GpuOffer]:
        if pool.gpu is None:
            return []
        import oci

        settings = settings_of(pool, OciSettings)
        offers: list[GpuOffer] = []
        for region in self._regions(pool):
            clients = self.clients.get(settings, region)
            for domain in self._domains(clients, pool):
                where = f"pool {pool.name!r} in {region}, domain {domain}"
                answer = self._call(
                    partial(
                        all_pages,
                        clients.compute.list_shapes,
                        settings.compartment_id,
                        availability_domain=domain,
                        image_id=settings.image_id,
                    ),
                    doing="ListShapes",
                    where=where,
                )
                shapes = matching_shapes(pool, [oci.util.to_dict(s) for s in answer])
                if not shapes:
                    continue
                availability = self._capacity(clients, pool, domain, [s["shape"] for s, _, _ in shapes])
                offers.extend(
                    shape_offer(
                        shape,
                        gpu,
                        count,
                        region=region,
                        domain=domain,
                        availability=availability.get(str(shape["shape"]), Availability.UNKNOWN),
                    )
                    for shape, gpu, count in shapes
                )
        return offers

    def _capacity(self, clients: Clients, pool: Pool, domain: str, shapes: list[str]) -> dict[str, Availability]:
        """Availability per shape from a capacity report; empty (all unknown) when the report fails."""
        import oci

        settings = settings_of(pool, OciSettings)
        details = oci.core.models.CreateComputeCapacityReportDetails(
            compartment_id=settings.compartment_id,
            availability_domain=domain,
            shape_availabilities=[
                oci.core.models.CreateCapacityReportShapeAvailabilityDetails(instance_shape=name) for name in shapes
            ],
        )
        try:
            report = clients.compute.create_compute_capacity_report(details).data
        except Exception as exc:  # optional: any failure leaves availability unknown
            if self.ctx is not None:
                code = getattr(exc, "code", None) or type(exc).__name__
                self.ctx.log.debug(
                    "capacity report for pool %r in %s, %s failed (%s); availability unknown",
                    pool.name,
                    clients.region,
                    domain,
                    code,
                )
            return {}
        return availability_from_report(oci.util.to_dict(report))

    # ------------------------------------------------------------------ provision

    @hookimpl
    def levers9_provision(self, request: ProvisionRequest) -> Machine:
        import oci

        pool = request.pool
        settings = settings_of(pool, OciSettings)
        offer = request.offer
        region = (offer.region if offer else None) or request.region or self._regions(pool)[0]
        clients = self.clients.get(settings, region)
        shape = (
            offer.instance_type if offer and offer.instance_type else (settings.shapes[0] if settings.shapes else None)
        )
        if not shape:
            raise InvalidRequest(
                f"pool {pool.name!r}: no offer names a shape and settings.shapes is empty; name the shape to launch",
                code="NoShape",
            )
        domain = offer.zone if offer and offer.zone else self._domains(clients, pool)[0]
        where = f"pool {pool.name!r}, shape {shape} in {region}, domain {domain}"
        details = self._launch_details(request, shape=shape, domain=domain, where=where)
        token = retry_token(request.machine_id)
        deadline = time.monotonic() + LAUNCH_BUDGET_S
        pause = LAUNCH_BACKOFF_S
        attempt = 0
        while True:
            attempt += 1
            try:
                instance = clients.compute.launch_instance(
                    details, opc_retry_token=token, retry_strategy=oci.retry.NoneRetryStrategy()
                ).data
                break
            except (oci.exceptions.RequestException, oci.exceptions.ConnectTimeout) as exc:
                # no answer: the launch may or may not have taken effect; the same token makes a resend safe
                # another attempt only when it can finish (connect and read timeouts) within the budget
                if (
                    attempt >= LAUNCH_ATTEMPTS
                    or time.monotonic() + pause + CONNECT_TIMEOUT_S + READ_TIMEOUT_S > deadline
                ):
                    typed = translate(exc, doing=f"LaunchInstance ({attempt} attempts)", where=where)
                    raise (typed or Throttled(f"LaunchInstance for {where} got no answer")) from exc
                self.log_info("LaunchInstance for %s got no answer (%s); resending", where, type(exc).__name__)
                self._sleep(pause)
                pause *= 2
            except Exception as exc:
                raise_typed(exc, partial(translate, doing="LaunchInstance", where=where))
        return Machine(
            provider_id=instance.id,
            machine_id=request.machine_id,
            pool=pool.name,
            state=_STATES.get(str(instance.lifecycle_state), MachineState.PENDING),
            gpu=offer.gpu if offer else pool.gpu,
            gpu_count=offer.gpu_count if offer else pool.gpu_count,
            region=region,
            zone=domain,
            instance_type=shape,
            created_at=instance.time_created,
            labels=dict(pool.labels),
            provider_data={
                "region": region,
                "compartment_id": settings.compartment_id,
                "availability_domain": domain,
            },
        )

    def _launch_details(self, request: ProvisionRequest, *, shape: str, domain: str, where: str) -> Any:
        import oci

        models = oci.core.models
        pool = request.pool
        settings = settings_of(pool, OciSettings)
        try:
            user_data = base64.b64encode(cloud_init(request.bootstrap).encode()).decode()
        except ValueError as exc:
            raise InvalidRequest(
                f"the worker bootstrap for {where} cannot be rendered: {exc}", code="UserData"
            ) from exc
        metadata = {"user_data": user_data}
        if settings.ssh_authorized_keys_file is not None:
            path = Path(settings.ssh_authorized_keys_file).expanduser()
            try:
                metadata["ssh_authorized_keys"] = path.read_text().strip()
            except OSError as exc:
                raise InvalidRequest(
                    f"pool {pool.name!r}: cannot read ssh_authorized_keys_file {path}: {exc.strerror}",
                    code="SshAuthorizedKeysFile",
                ) from exc
        shape_config = None
        if shape.endswith(".Flex") and settings.shape_config is not None:
            shape_config = models.LaunchInstanceShapeConfigDetails(
                ocpus=settings.shape_config.ocpus, memory_in_gbs=settings.shape_config.memory_in_gbs
            )
        preemptible = None
        if pool.preemptible:
            preemptible = models.PreemptibleInstanceConfigDetails(
                preemption_action=models.TerminatePreemptionAction(preserve_boot_volume=False)
            )
        return models.LaunchInstanceDetails(
            availability_domain=domain,
            compartment_id=settings.compartment_id,
            shape=shape,
            shape_config=shape_config,
            source_details=models.InstanceSourceViaImageDetails(
                image_id=settings.image_id, boot_volume_size_in_gbs=settings.boot_volume_gib
            ),
            create_vnic_details=models.CreateVnicDetails(
                subnet_id=settings.subnet_id, assign_public_ip=settings.assign_public_ip
            ),
            display_name=f"levers9-{request.machine_id}",
            freeform_tags={**settings.freeform_tags, MACHINE_TAG: request.machine_id, POOL_TAG: pool.name},
            metadata=metadata,
            preemptible_instance_config=preemptible,
        )

    # ------------------------------------------------------------------ terminate

    @hookimpl
    def levers9_terminate(self, pool: Pool, machine: Machine) -> None:
        instance_id = machine.provider_id
        if not instance_id.startswith("ocid1.instance."):
            return  # no OCI instance has this id: nothing to terminate
        region = machine.provider_data.get("region") or machine.region or self._regions(pool)[0]
        clients = self.clients.get(settings_of(pool, OciSettings), region)
        where = f"pool {pool.name!r}, instance {instance_id} in {region}"
        try:
            clients.compute.terminate_instance(
                instance_id, preserve_boot_volume=False, preserve_data_volumes_created_at_launch=False
            )
        except Exception as exc:
            if is_service_error(exc, 404, "NotAuthorizedOrNotFound"):
                return  # unknown, or gone long enough that OCI forgot it
            if is_service_error(exc, 409) and self._terminated(clients, instance_id, where):
                return
            raise_typed(exc, partial(translate, doing="TerminateInstance", where=where))

    def _terminated(self, clients: Clients, instance_id: str, where: str) -> bool:
        """True when the instance is already on its way out (a 409 to a terminate is then success)."""
        try:
            state = self._call(
                lambda: clients.compute.get_instance(instance_id).data.lifecycle_state,
                doing="GetInstance",
                where=where,
            )
        except InvalidRequest:
            return True  # 404: gone
        return state in ("TERMINATING", "TERMINATED")

    # ------------------------------------------------------------------ list

    @hookimpl
    def levers9_list_machines(self, pool: Pool) -> list[Machine]:
        settings = settings_of(pool, OciSettings)
        machines: list[Machine] = []
        for region in self._regions(pool):
            clients = self.clients.get(settings, region)
            answer = self._call(
                partial(all_pages, clients.compute.list_instances, settings.compartment_id),
                doing="ListInstances",
                where=f"pool {pool.name!r} in {region}",
            )
            for instance in answer:
                tags = instance.freeform_tags or {}
                if tags.get(POOL_TAG) != pool.name or instance.lifecycle_state == "TERMINATED":
                    continue
                machines.append(self._machine(pool, region, instance))
        return machines

    def _machine(self, pool: Pool, region: str, instance: Any) -> Machine:
        state_word = str(instance.lifecycle_state)
        state = _STATES.get(state_word, MachineState.UNKNOWN)
        tags = instance.freeform_tags or {}
        return Machine(
            provider_id=instance.id,
            machine_id=tags.get(MACHINE_TAG),
            pool=pool.name,
            state=state,
            gpu=pool.gpu,
            gpu_count=pool.gpu_count,
            region=region,
            zone=instance.availability_domain,
            instance_type=instance.shape,
            created_at=instance.time_created,
            labels=dict(pool.labels),
            provider_data={
                "region": region,
                "compartment_id": instance.compartment_id,
                "availability_domain": instance.availability_domain,
            },
            reason=f"OCI reports the instance {state_word}" if state is MachineState.FAILED else None,
        )

    # ------------------------------------------------------------------ check

    @hookimpl
    def levers9_check(self, pool: Pool) -> ProviderCheck:
        settings = settings_of(pool, OciSettings)
        who = (
            f"profile {settings.profile!r} ({settings.auth})"
            if settings.auth in ("api_key", "security_token")
            else settings.auth.replace("_", " ")
        )
        try:
            region = self._regions(pool)[0]
            clients = self.clients.get(settings, region)
            domains = self._call(
                lambda: clients.identity.list_availability_domains(settings.compartment_id).data,
                doing="ListAvailabilityDomains",
                where=f"pool {pool.name!r} in {region}",
            )
        except AuthenticationFailed as exc:
            return ProviderCheck(
                ok=False,
                message=f"OCI rejected the credentials of {who}: {exc.message}",
                hint=(
                    f"check {settings.config_file} (profile {settings.profile!r}): its user, tenancy, fingerprint "
                    "and key_file must match an API key uploaded for that user"
                    if settings.auth == "api_key"
                    else "renew the credentials (`oci session authenticate` for a security token; a dynamic group "
                    "and policy for a principal)"
                ),
            )
        except PermissionDenied as exc:
            return ProviderCheck(
                ok=False,
                message=f"{who} may not list availability domains: {exc.message}",
                hint="add a policy allowing the user's group to inspect compartments and manage instances",
            )
        except ProviderError as exc:
            return ProviderCheck(ok=False, message=f"OCI check of {who} failed: {exc.message}", hint=None)
        return ProviderCheck(
            ok=True,
            message=f"credentials of {who} accepted in {region}: {len(domains)} availability domain"
            f"{'' if len(domains) == 1 else 's'} ({', '.join(d.name for d in domains)})",
        )
