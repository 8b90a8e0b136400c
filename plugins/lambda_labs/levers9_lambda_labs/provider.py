"""The ``lambda_labs`` provider's hooks: each worker is one Lambda Cloud on-demand instance.

What each hook asks of the Cloud API (docs/architecture.md section 5, the lambda_labs column):

* offers: ``GET /instance-types``; each type whose GPUs (read with
  :func:`levers9.gpu.normalize.from_lambda_instance_type`) are the pool's type
  and count, limited to ``settings.instance_types`` when given, is offered once
  per region of the pool (every region the answer names, when the pool names
  none): ``available`` where the type is listed in
  ``regions_with_capacity_available``, ``unavailable`` elsewhere, priced at
  ``price_cents_per_hour / 100`` US dollars. No zones: Lambda places by region.
* provision: ``POST /instance-operations/launch`` with the offer's region and
  type, the pool's one SSH key (and at most one filesystem, and the image
  family), the name ``levers9-<machine_id>``, the tags ``levers9:machine-id``
  and ``levers9:pool`` (the API's tag keys allow ``[a-z0-9-:]``), and
  ``levers9.bootstrap.cloud_init`` as plain-text ``user_data``.
* terminate: ``POST /instance-operations/terminate``; an unknown id (the API's
  404 ``global/object-does-not-exist``) or an instance already ``terminated`` is
  success. A 404 without that code is not: it means ``api_url`` names no Cloud
  API, and calling that success would leave the instance running.
* list: ``GET /instances`` (one page: the API documents no pagination), the
  instances tagged with the pool, and those with no tags named ``levers9-<machine
  id>`` (an answer may omit tags: such an instance is listed in every pool, and
  the core leaves a machine whose record is another pool's to that pool),
  ``terminated`` ones left out; booting ->
  pending, active -> running, unhealthy -> failed, terminating -> stopping,
  preempted -> preempted.
* check: ``GET /instance-types`` with the pool's key.

Idempotency: the launch API takes no idempotency key. So before launching,
and again after an answer that may hide a launch (a read timeout, a reset
connection, a 5xx), ``GET /instances`` is searched for a live instance of
the request's machine id (by its tag, or by its name when the answer has no
tags); found, it is returned instead of launching again. A failure whose
outcome is unknown and whose instance is not (yet) listed raises
``Throttled``: the core retries, and the retry looks again before it launches. (An instance the API accepted but does not list by the
time of the retry would be launched twice; the API offers nothing better.)

Rate limits: launches are paced per API key (:mod:`levers9_lambda_labs.ratelimit`)
and a launch that comes too soon raises ``Throttled(retry_after=<seconds
left>)`` at once, never sleeping; a 429 from the API is ``Throttled`` too.

Errors are mapped by :mod:`levers9_lambda_labs.errors`; an unset key variable
is ``AuthenticationFailed`` naming the variable.

:class:`LambdaLabsProvider` is the plugin: the entry point names its one
instance (``levers9_lambda_labs.plugin``), whose ``levers9_*`` methods are the
hooks. A pool's settings reach them as :class:`LambdaLabsSettings`
(``settings_of``; a pool holding another provider's is ``InvalidRequest``).
"""

from __future__ import annotations

import hashlib
from typing import Any
from urllib.parse import quote

from levers9.bootstrap import cloud_init
from levers9.gpu.catalog import CATALOG
from levers9.gpu.normalize import from_lambda_instance_type
from levers9.hooks.errors import InvalidRequest, ProviderError, Throttled
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
from levers9_lambda_labs.api import CloudApi, Unreachable, api_key
from levers9_lambda_labs.errors import (
    ACCOUNT_INACTIVE,
    INSUFFICIENT_CAPACITY,
    INVALID_API_KEY,
    NOT_FOUND,
    QUOTA_EXCEEDED,
    ApiFailure,
    missing_key,
    typed_error,
    unreachable,
)
from levers9_lambda_labs.ratelimit import LAUNCH_INTERVAL_S, REQUEST_INTERVAL_S, LaunchPacer
from levers9_lambda_labs.settings import LambdaLabsSettings

__all__ = [
    "MACHINE_ID_TAG",
    "NAME_PREFIX",
    "POOL_TAG",
    "USER_DATA_MAX_BYTES",
    "LambdaLabsProvider",
    "instance_name",
]

PROVIDER = "lambda_labs"
MACHINE_ID_TAG = "levers9:machine-id"
POOL_TAG = "levers9:pool"
NAME_PREFIX = "levers9-"
#: the launch API's limits: a name of 64 characters, a tag value of 128, user data of 1 MB of plain text
NAME_MAX = 64
TAG_VALUE_MAX = 128
USER_DATA_MAX_BYTES = 1024 * 1024
_STATES = {
    "booting": MachineState.PENDING,
    "active": MachineState.RUNNING,
    "unhealthy": MachineState.FAILED,
    "terminating": MachineState.STOPPING,
    "terminated": MachineState.TERMINATED,
    "preempted": MachineState.PREEMPTED,
}
_KEY_HINT = "create a Cloud API key at https://cloud.lambda.ai/api-keys and put it in ${var} where levers9 runs"


def instance_name(machine_id: str) -> str:
    """The instance's name: ``levers9-<machine_id>``, cut to the API's 64 characters."""
    return f"{NAME_PREFIX}{machine_id}"[:NAME_MAX]


def _tags(instance: dict[str, Any]) -> dict[str, str]:
    found = instance.get("tags")
    if not isinstance(found, list):
        return {}
    return {
        t["key"]: t["value"]
        for t in found
        if isinstance(t, dict) and isinstance(t.get("key"), str) and isinstance(t.get("value"), str)
    }


def _identity(instance: dict[str, Any]) -> tuple[str | None, str | None]:
    """(machine id, pool) of a listed instance: from its tags; without a machine-id tag, the machine id from its
    name ``levers9-<machine id>`` (the pool then unknown: None), as an answer may carry no tags."""
    tags = _tags(instance)
    machine_id = tags.get(MACHINE_ID_TAG)
    if machine_id is None:
        name = instance.get("name")
        if isinstance(name, str) and name.startswith(NAME_PREFIX) and len(name) > len(NAME_PREFIX):
            machine_id = name[len(NAME_PREFIX) :]
    return machine_id, tags.get(POOL_TAG)


def _name_of(value: Any) -> str | None:
    """``{"name": ...}`` (a region or an instance type in an answer) -> its name."""
    if isinstance(value, dict) and isinstance(value.get("name"), str):
        return str(value["name"])
    return None


def _capacity(item: Any) -> set[str]:
    """The region names an ``/instance-types`` entry lists under ``regions_with_capacity_available``."""
    found = item.get("regions_with_capacity_available") if isinstance(item, dict) else None
    names = {_name_of(region) for region in found} if isinstance(found, list) else set()
    return {name for name in names if name is not None}


def _ambiguous(failure: ApiFailure) -> bool:
    """Whether a failed launch may still have started an instance: a 5xx, a 408, or a 2xx without a usable body
    (a 5xx that is a capacity or quota answer started nothing)."""
    unclear = failure.status >= 500 or failure.status == 408 or failure.status < 400
    return unclear and failure.code not in (INSUFFICIENT_CAPACITY, QUOTA_EXCEEDED)


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class LambdaLabsProvider(ProviderPlugin):
    """The ``lambda_labs`` plugin: its hooks, and their state (the HTTP clients, the launch pacer, the context)."""

    #: the edition of the hook spec these hooks follow
    LEVERS9_SPEC_VERSION = 2
    settings_model = LambdaLabsSettings

    def __init__(self, pacer: LaunchPacer | None = None) -> None:
        super().__init__()
        self.api = CloudApi()
        self.pacer = pacer or LaunchPacer(LAUNCH_INTERVAL_S)

    # -------------------------------------------------------------------------- lifecycle

    def close(self) -> None:
        self.api.close()

    def _launch_wait(self) -> float:
        """How long to wait before retrying a launch the API did not take: the launch interval, 1 s at least."""
        return max(self.pacer.interval_s, REQUEST_INTERVAL_S)

    # -------------------------------------------------------------------------- calls

    def _key(self, pool: Pool, settings: LambdaLabsSettings) -> str:
        key = api_key(settings)
        if key is None:
            raise missing_key(settings.api_key_env, pool.name)
        return key

    def _call(
        self,
        settings: LambdaLabsSettings,
        key: str,
        method: str,
        path: str,
        doing: str,
        body: Any = None,
    ) -> Any:
        """One API call whose failures are typed errors (for every call but the launch itself)."""
        try:
            return self.api.call(settings, key, method, path, body)
        except ApiFailure as failure:
            raise typed_error(failure, doing, default_retry_after=REQUEST_INTERVAL_S) from None
        except Unreachable as exc:
            raise unreachable(doing, exc.detail, retry_after=REQUEST_INTERVAL_S) from None

    def _instances(self, settings: LambdaLabsSettings, key: str, doing: str) -> list[dict[str, Any]]:
        data = self._call(settings, key, "GET", "/instances", doing)
        if not isinstance(data, list):
            raise ProviderError(f"{doing}: GET /instances answered {type(data).__name__}, not a list")
        return [i for i in data if isinstance(i, dict) and isinstance(i.get("id"), str)]

    def _instance_types(self, settings: LambdaLabsSettings, key: str, doing: str) -> dict[str, Any]:
        data = self._call(settings, key, "GET", "/instance-types", doing)
        if not isinstance(data, dict):
            raise ProviderError(f"{doing}: GET /instance-types answered {type(data).__name__}, not an object")
        return data

    # -------------------------------------------------------------------------- offers

    @hookimpl
    def levers9_gpu_offers(self, pool: Pool) -> list[GpuOffer]:
        if not pool.gpu or pool.gpu_count <= 0:
            return []
        settings = settings_of(pool, LambdaLabsSettings)
        key = self._key(pool, settings)
        types = self._instance_types(settings, key, f"pool {pool.name!r}: listing instance types")
        known_regions = {name for item in types.values() for name in _capacity(item)}
        regions = list(pool.regions) or sorted(known_regions)
        catalog = CATALOG.get(pool.gpu)
        offers: list[GpuOffer] = []
        for type_name, item in sorted(types.items()):
            if not isinstance(item, dict) or (settings.instance_types and type_name not in settings.instance_types):
                continue
            gpu, count = from_lambda_instance_type(item)
            if gpu != pool.gpu or count != pool.gpu_count:
                continue
            spec = _object(item.get("instance_type"))
            specs = _object(spec.get("specs"))
            cents = _int(spec.get("price_cents_per_hour"))
            vcpus, memory_gib = _int(specs.get("vcpus")), _int(specs.get("memory_gib"))
            with_capacity = _capacity(item)
            for region in regions:
                offers.append(
                    GpuOffer(
                        gpu=gpu,
                        gpu_count=count,
                        gpu_memory_mib=max(1, catalog.memory_mib if catalog is not None else 1),
                        region=region,
                        zone=None,
                        instance_type=type_name,
                        cpu_millicores=vcpus * 1000 if vcpus else None,
                        memory_mib=memory_gib * 1024 if memory_gib else None,
                        availability=Availability.AVAILABLE if region in with_capacity else Availability.UNAVAILABLE,
                        price_per_hour=cents / 100 if cents is not None and cents >= 0 else None,
                    )
                )
        return offers

    # -------------------------------------------------------------------------- provision

    def _target(self, request: ProvisionRequest, settings: LambdaLabsSettings) -> tuple[str, str]:
        """(instance type, region) to launch: the offer's, else the pool's only configured type."""
        pool = request.pool
        offer = request.offer
        instance_type = offer.instance_type if offer is not None else None
        if instance_type is None and len(settings.instance_types) == 1:
            instance_type = settings.instance_types[0]
        region = (offer.region if offer is not None else None) or request.region or pool.region
        if instance_type is None:
            raise InvalidRequest(
                f"pool {pool.name!r}: no instance type to launch (no offer; the pool needs a gpu and gpu_count that "
                "a Lambda instance type has, or exactly one entry in settings.instance_types)",
                code="no-instance-type",
            )
        if region is None:
            raise InvalidRequest(
                f"pool {pool.name!r}: no region to launch {instance_type} in (set the pool's region)",
                code="no-region",
            )
        return instance_type, region

    def _launch_body(
        self, request: ProvisionRequest, settings: LambdaLabsSettings, instance_type: str, region: str, doing: str
    ) -> dict[str, Any]:
        pool = request.pool
        for value, what in ((request.machine_id, "machine id"), (pool.name, "pool name")):
            if len(value) > TAG_VALUE_MAX:
                raise InvalidRequest(
                    f"{doing}: the {what} {value[:20]!r}… is longer than a Lambda tag value ({TAG_VALUE_MAX})",
                    code="tag-too-long",
                )
        try:
            user_data = cloud_init(request.bootstrap)
        except ValueError as exc:
            raise InvalidRequest(
                f"{doing}: the worker's user data cannot be rendered: {exc}", code="user-data"
            ) from None
        size = len(user_data.encode())
        if size > USER_DATA_MAX_BYTES:
            raise InvalidRequest(
                f"{doing}: the worker's user data takes {size} bytes, Lambda accepts at most {USER_DATA_MAX_BYTES}",
                code="user-data-too-large",
            )
        body: dict[str, Any] = {
            "region_name": region,
            "instance_type_name": instance_type,
            "ssh_key_names": list(settings.ssh_key_names),
            "name": instance_name(request.machine_id),
            "tags": [
                {"key": MACHINE_ID_TAG, "value": request.machine_id},
                {"key": POOL_TAG, "value": pool.name},
            ],
            "user_data": user_data,
        }
        if settings.file_system_names:
            body["file_system_names"] = list(settings.file_system_names)
        if settings.image_family:
            body["image"] = {"family": settings.image_family}
        return body

    def _find_launched(
        self, request: ProvisionRequest, settings: LambdaLabsSettings, key: str, doing: str
    ) -> Machine | None:
        """The live instance already tagged with the request's machine id, if the API lists one."""
        for instance in self._instances(settings, key, f"{doing} (looking for its instance)"):
            if _identity(instance)[0] == request.machine_id and instance.get("status") != "terminated":
                return self._machine(instance, request.pool.name)
        return None

    @hookimpl
    def levers9_provision(self, request: ProvisionRequest) -> Machine:
        pool = request.pool
        settings = settings_of(pool, LambdaLabsSettings)
        instance_type, region = self._target(request, settings)
        doing = f"pool {pool.name!r}: launching {instance_type} in {region} for machine {request.machine_id}"
        body = self._launch_body(request, settings, instance_type, region, doing)
        key = self._key(pool, settings)
        found = self._find_launched(request, settings, key, doing)
        if found is not None:
            self.log_info(
                "machine %s of pool %s is already instance %s", request.machine_id, pool.name, found.provider_id
            )
            return found
        wait = self.pacer.reserve((str(settings.api_url), hashlib.sha256(key.encode()).hexdigest()))
        if wait > 0:
            raise Throttled(
                f"{doing}: the Cloud API allows one launch per {self.pacer.interval_s:g} s per API key; "
                f"the next is possible in {wait:.1f} s",
                code="launch-paced",
                retry_after=wait,
            )
        try:
            data = self.api.call(settings, key, "POST", "/instance-operations/launch", body)
        except ApiFailure as failure:
            if _ambiguous(failure):
                code = failure.code or f"HTTP {failure.status}"
                return self._after_ambiguous(request, settings, key, doing, failure.words, code, failure.retry_after)
            raise typed_error(failure, doing, default_retry_after=self._launch_wait()) from None
        except Unreachable as exc:
            if not exc.sent:
                raise unreachable(doing, exc.detail, retry_after=self._launch_wait()) from None
            return self._after_ambiguous(request, settings, key, doing, exc.detail, "unreachable", None)
        ids = data.get("instance_ids") if isinstance(data, dict) else None
        if not isinstance(ids, list) or not ids or not isinstance(ids[0], str):
            # accepted, but which instance? the tag says, as after a lost answer
            detail = "the launch answer names no instance id"
            return self._after_ambiguous(request, settings, key, doing, detail, "no-instance-id", None)
        self.log_info(
            "launched instance %s for machine %s of pool %s in %s", ids[0], request.machine_id, pool.name, region
        )
        return Machine(
            provider_id=ids[0],
            machine_id=request.machine_id,
            pool=pool.name,
            state=MachineState.PENDING,
            gpu=request.offer.gpu if request.offer is not None else pool.gpu,
            gpu_count=request.offer.gpu_count if request.offer is not None else pool.gpu_count,
            region=region,
            instance_type=instance_type,
            provider_data={"region": region},
        )

    def _after_ambiguous(
        self,
        request: ProvisionRequest,
        settings: LambdaLabsSettings,
        key: str,
        doing: str,
        detail: str,
        code: str,
        retry_after: float | None,
    ) -> Machine:
        """The launch may or may not have happened: return its instance when listed, else ``Throttled``."""
        try:
            found = self._find_launched(request, settings, key, doing)
        except ProviderError:
            found = None
        if found is not None:
            self.log_info(
                "launch for machine %s got no clear answer (%s) but started %s",
                request.machine_id,
                detail,
                found.provider_id,
            )
            return found
        raise Throttled(
            f"{doing}: no clear answer from the Cloud API ({detail}) and no instance tagged with the machine id is "
            "listed yet; the retry looks for it again before launching",
            code=code,
            retry_after=retry_after if retry_after is not None else self._launch_wait(),
        )

    # -------------------------------------------------------------------------- terminate and list

    @hookimpl
    def levers9_terminate(self, pool: Pool, machine: Machine) -> None:
        settings = settings_of(pool, LambdaLabsSettings)
        key = self._key(pool, settings)
        doing = f"pool {pool.name!r}: terminating instance {machine.provider_id}"
        try:
            self.api.call(
                settings, key, "POST", "/instance-operations/terminate", {"instance_ids": [machine.provider_id]}
            )
        except ApiFailure as failure:
            if failure.code == NOT_FOUND:
                return
            if failure.status == 400 and self._terminated(settings, key, machine.provider_id):
                return
            raise typed_error(failure, doing, default_retry_after=REQUEST_INTERVAL_S) from None
        except Unreachable as exc:
            raise unreachable(doing, exc.detail, retry_after=REQUEST_INTERVAL_S) from None
        self.log_info(
            "terminated instance %s (machine %s) of pool %s", machine.provider_id, machine.machine_id, pool.name
        )

    def _terminated(self, settings: LambdaLabsSettings, key: str, instance_id: str) -> bool:
        """Whether the refused terminate was of an instance that is gone already."""
        try:
            data = self.api.call(settings, key, "GET", f"/instances/{quote(instance_id, safe='')}")
        except ApiFailure as failure:
            return failure.code == NOT_FOUND
        except Unreachable:
            return False
        return isinstance(data, dict) and data.get("status") == "terminated"

    def _machine(self, instance: dict[str, Any], pool: str) -> Machine:
        status = str(instance.get("status") or "")
        state = _STATES.get(status, MachineState.UNKNOWN)
        region = _name_of(instance.get("region"))
        type_info = instance.get("instance_type")
        gpu, count = from_lambda_instance_type(type_info) if isinstance(type_info, dict) else (None, 0)
        reason = None
        if state is MachineState.FAILED:
            reason = f"Lambda reports the instance {status}"
        elif state is MachineState.PREEMPTED:
            reason = "Lambda preempted the instance"
        return Machine(
            provider_id=str(instance["id"]),
            machine_id=_identity(instance)[0],
            pool=pool,
            state=state,
            gpu=gpu,
            gpu_count=count,
            region=region,
            instance_type=_name_of(type_info),
            address=instance.get("ip") if isinstance(instance.get("ip"), str) else None,
            provider_data={"region": region},
            reason=reason,
        )

    @hookimpl
    def levers9_list_machines(self, pool: Pool) -> list[Machine]:
        settings = settings_of(pool, LambdaLabsSettings)
        key = self._key(pool, settings)
        machines = []
        for instance in self._instances(settings, key, f"pool {pool.name!r}: listing instances"):
            machine_id, owner = _identity(instance)
            # an instance without tags is listed by its name in every pool: the core leaves alone a machine
            # whose record is another pool's
            if owner != pool.name and (owner is not None or machine_id is None):
                continue
            if instance.get("status") == "terminated":
                continue
            machines.append(self._machine(instance, pool.name))
        return machines

    # -------------------------------------------------------------------------- check

    @hookimpl
    def levers9_check(self, pool: Pool) -> ProviderCheck:
        settings = settings_of(pool, LambdaLabsSettings)
        var = settings.api_key_env
        key = api_key(settings)
        if key is None:
            return ProviderCheck(
                ok=False,
                message=f"the environment variable {var} (the pool's api_key_env) is not set",
                hint=_KEY_HINT.replace("{var}", var),
            )
        try:
            data = self.api.call(settings, key, "GET", "/instance-types")
        except ApiFailure as failure:
            if failure.code in (INVALID_API_KEY, ACCOUNT_INACTIVE) or failure.status in (401, 403):
                hint = (
                    _KEY_HINT.replace("{var}", var)
                    if failure.code == INVALID_API_KEY or failure.status == 401
                    else failure.suggestion or "see the account's status in the Lambda Cloud console"
                )
                return ProviderCheck(
                    ok=False,
                    message=f"{settings.api_url} refused the API key in {var}: {failure.words} "
                    f"({failure.code or failure.status})",
                    hint=hint,
                )
            raise typed_error(
                failure, f"pool {pool.name!r}: checking the API key in {var}", default_retry_after=1.0
            ) from None
        except Unreachable as exc:
            raise unreachable(f"pool {pool.name!r}: checking the API key in {var}", exc.detail) from None
        count = len(data) if isinstance(data, dict) else 0
        return ProviderCheck(
            ok=True,
            message=f"the API key in {var} is accepted by {settings.api_url}: {count} instance types listed",
        )
