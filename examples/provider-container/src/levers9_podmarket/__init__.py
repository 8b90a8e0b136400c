"""A levers9 provider for a container marketplace ("podmarket"): pods from an image, no machines, no user data.

It shows plugin authors a container cloud end to end (docs/plugins.md,
"Container clouds"). The marketplace, as its HTTP API (``api_url``) shows it:

* **offers** (``GET /v1/offers``): a GPU model in a datacenter, how many per
  pod, each GPU's memory as ``nvidia-smi`` reports it, on-demand and spot
  prices, stock, and marketplace facts levers9 has no field for: the cloud
  (``secure`` or ``community``) and the card's form factor (``sxm``, ``pcie``),
  which this plugin passes on in ``GpuOffer.details``. A datacenter
  (``eu-ro-1``) is the offer's zone, its prefix (``eu``) the region;
* **pods** (``POST /v1/pods``): an image, a command, plain ``env``, and
  ``secret_env`` mapping a variable to the name of a stored **secret**
  (``POST /v1/secrets``); ``labels`` are how this plugin finds its pods again
  (the pool and levers9's machine id); a pod publishes only the ports it
  names, and this plugin names none;
* **spot** pods run at a bid; one that is outbid is stopped and listed
  ``outbid``, which this plugin reports as ``preempted``;
* errors are HTTP statuses with a JSON ``{"error": code, "message": ...}``:
  401 a rejected key, 402 an account without the balance to start the pod,
  409 no stock left, 400 a bad request, 429 and 5xx worth retrying.

What the plugin promises (docs/plugins.md §5): a pod runs
``levers9.bootstrap.container_spec(request.bootstrap)`` as it is; the join
token becomes the marketplace secret ``levers9-<machine id>``, which nothing
but the pod reads and which ``levers9_terminate`` deletes with the pod (as
does a start that fails after storing it); provisioning is idempotent per
machine id (a pod labelled with it is answered again); every machine says
``provider_data["reachable"] = False`` (nothing can dial into a pod that
publishes no port: its worker serves through a tunnel); an insufficient
balance is :class:`~levers9.hooks.errors.BillingRefused`, no stock
:class:`~levers9.hooks.errors.InsufficientCapacity`.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field

from levers9 import hookimpl
from levers9.bootstrap import container_spec
from levers9.hooks.errors import (
    AuthenticationFailed,
    BillingRefused,
    InsufficientCapacity,
    InvalidRequest,
    ProviderError,
    Throttled,
)
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

__all__ = ["GPU_TYPES", "PodMarketProvider", "PodMarketSettings", "plugin", "secret_name"]

#: the marketplace's GPU models, as levers9's catalog names them
GPU_TYPES = {
    "H100 SXM": "H100",
    "H100 PCIe": "H100",
    "H100 NVL": "H100-NVL",  # 94 GB: its own type, never offered for an 80 GB H100
    "RTX 4090": "RTX4090",
    "RTX 3090": "RTX3090",
    "RTX 6000 Ada": "RTX6000-Ada",
    "L4": "L4",
}
#: pod status on the marketplace → the machine's state
STATES = {
    "starting": MachineState.PENDING,
    "running": MachineState.RUNNING,
    "outbid": MachineState.PREEMPTED,
    "failed": MachineState.FAILED,
    "exited": MachineState.FAILED,
    "terminated": MachineState.TERMINATED,
}
#: the labels a pod carries for levers9
POOL_LABEL = "levers9-pool"
MACHINE_LABEL = "levers9-machine-id"


class PodMarketSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    api_url: str = Field(description="The marketplace API's base URL.")
    api_key_env: str = Field("PODMARKET_API_KEY", description="The environment variable holding the API key.")
    spot: bool = Field(False, description="Start spot pods (at bid_per_hour, or the spot price) instead of on-demand.")
    bid_per_hour: float | None = Field(None, gt=0, description="The spot bid in US dollars per pod-hour.")
    cloud: Literal["secure", "community", "any"] = Field(
        "any", description="Offer only pods of the marketplace's secure cloud, its community cloud, or either."
    )
    request_timeout_s: float = Field(30.0, gt=0)


def secret_name(machine_id: str) -> str:
    """The marketplace secret holding a machine's join token."""
    return f"levers9-{machine_id}"


def _settings(pool: Pool) -> PodMarketSettings:
    return settings_of(pool, PodMarketSettings)


def _client(settings: PodMarketSettings) -> httpx.Client:
    key = os.environ.get(settings.api_key_env, "")
    if not key:
        raise AuthenticationFailed(f"${settings.api_key_env} is empty: set it to a podmarket API key", code="no-key")
    return httpx.Client(
        base_url=settings.api_url, headers={"Authorization": f"Bearer {key}"}, timeout=settings.request_timeout_s
    )


def _raise_for(response: httpx.Response) -> None:
    """The marketplace's error as levers9's typed error (docs/plugins.md §10)."""
    if response.is_success:
        return
    try:
        body = response.json()
    except ValueError:
        body = {}
    code, message = str(body.get("error", response.status_code)), str(body.get("message", response.text[:200]))
    if response.status_code == 401:
        raise AuthenticationFailed(f"podmarket refused the API key: {message}", code=code)
    if response.status_code == 402:
        raise BillingRefused(f"podmarket: {message}; top up the account's balance", code=code)
    if response.status_code == 409:
        raise InsufficientCapacity(f"podmarket: {message}", code=code)
    if response.status_code == 429:
        raise Throttled(f"podmarket: {message}", code=code)
    if response.status_code in (400, 404, 422):
        raise InvalidRequest(f"podmarket: {message}", code=code)
    if response.status_code >= 500:  # retried by the core: provisioning is idempotent per machine id (by label)
        raise Throttled(f"podmarket answered {response.status_code}: {message}", code=code)
    raise ProviderError(f"podmarket answered {response.status_code}: {message}", code=code)


def _call(settings: PodMarketSettings, method: str, path: str, **kwargs: Any) -> Any:
    try:
        with _client(settings) as client:
            response = client.request(method, path, **kwargs)
    except httpx.HTTPError as exc:  # retryable, as a 5xx is
        raise Throttled(f"podmarket at {settings.api_url} did not answer {method} {path}: {exc}") from None
    if method == "DELETE" and response.status_code == 404:
        return None  # already gone: deleting is idempotent
    _raise_for(response)
    return response.json() if response.content else None


def _machine(pod: dict[str, Any]) -> Machine:
    datacenter = str(pod["datacenter"])
    state = STATES.get(str(pod["status"]), MachineState.FAILED)
    return Machine(
        provider_id=pod["id"],
        machine_id=pod["labels"].get(MACHINE_LABEL),
        pool=pod["labels"][POOL_LABEL],
        state=state,
        gpu=GPU_TYPES.get(pod["gpu"]),
        gpu_count=pod["gpu_count"],
        region=datacenter.split("-", 1)[0],
        zone=datacenter,
        instance_type=pod["offer_id"],
        created_at=datetime.fromtimestamp(pod["created"], UTC),
        # no address: a pod publishes no port, so nothing can dial in; its worker serves through a tunnel
        provider_data={"reachable": False, "secret": pod["secret_env"].get("LEVERS9_TOKEN", "")},
        reason=pod.get("reason") if state in (MachineState.PREEMPTED, MachineState.FAILED) else None,
    )


class PodMarketProvider:
    """The plugin: its ``levers9_*`` methods are the hooks; it keeps no state (the marketplace does)."""

    #: the edition of the hook spec this plugin is written to (docs/plugins.md, "The spec version")
    LEVERS9_SPEC_VERSION = 2

    @hookimpl
    def levers9_provider_settings(self) -> type[BaseModel]:
        return PodMarketSettings

    @hookimpl
    def levers9_check(self, pool: Pool) -> ProviderCheck:
        settings = _settings(pool)
        try:
            offers = _call(settings, "GET", "/v1/offers")
        except ProviderError as exc:
            return ProviderCheck(ok=False, message=exc.message, hint=f"check api_url and ${settings.api_key_env}")
        return ProviderCheck(ok=True, message=f"podmarket at {settings.api_url} lists {len(offers)} offers")

    @hookimpl
    def levers9_gpu_offers(self, pool: Pool) -> list[GpuOffer]:
        settings = _settings(pool)
        offers: list[GpuOffer] = []
        for offer in _call(settings, "GET", "/v1/offers"):
            gpu, datacenter = GPU_TYPES.get(offer["gpu"]), str(offer["datacenter"])
            region = datacenter.split("-", 1)[0]
            if gpu is None or pool.gpu not in (None, gpu) or (pool.regions and region not in pool.regions):
                continue
            if settings.cloud != "any" and offer["cloud"] != settings.cloud:
                continue
            price = offer["spot_price"] if settings.spot else offer["price"]
            offers.append(
                GpuOffer(
                    gpu=gpu,
                    gpu_count=offer["gpu_count"],
                    gpu_memory_mib=offer["memory_mib"],  # one GPU's, as nvidia-smi reports it
                    region=region,
                    zone=datacenter,
                    instance_type=offer["id"],
                    availability=Availability.AVAILABLE if offer["stock"] > 0 else Availability.UNAVAILABLE,
                    price_per_hour=price,
                    spot=settings.spot,
                    details={"cloud": offer["cloud"], "form_factor": offer["form_factor"]},
                )
            )
        return offers

    @hookimpl
    def levers9_provision(self, request: ProvisionRequest) -> Machine:
        settings, pool, offer = _settings(request.pool), request.pool, request.offer
        if offer is None or offer.instance_type is None:
            raise InvalidRequest("podmarket starts GPU pods only: give the pool a gpu, so levers9 picks an offer")
        labels = {POOL_LABEL: pool.name, MACHINE_LABEL: request.machine_id}
        for pod in _call(settings, "GET", "/v1/pods", params={"label": f"{MACHINE_LABEL}={request.machine_id}"}):
            if pod["status"] != "terminated":
                return _machine(pod)  # a retry: the pod this machine id already has
        spec = container_spec(request.bootstrap)  # image, command, env; the join token apart, in secret_env
        secret = secret_name(request.machine_id)
        _call(settings, "PUT", f"/v1/secrets/{secret}", json={"value": spec.secret_env["LEVERS9_TOKEN"]})
        try:
            pod = _call(
                settings,
                "POST",
                "/v1/pods",
                json={
                    "offer_id": offer.instance_type,
                    "datacenter": offer.zone,
                    "image": spec.image,
                    "command": spec.command,
                    "env": spec.env,
                    "secret_env": {name: secret for name in spec.secret_env},
                    "ports": [],
                    "labels": labels,
                    "spot": settings.spot,
                    "bid_per_hour": settings.bid_per_hour if settings.spot else None,
                },
            )
        except ProviderError:
            self._undo(settings, request.machine_id)  # a pod the marketplace made before failing goes, and the secret
            raise
        return _machine(pod)

    def _undo(self, settings: PodMarketSettings, machine_id: str) -> None:
        """What a failed start left: any pod labelled with the machine id (created, then the call failed), the secret."""
        for pod in _call(settings, "GET", "/v1/pods", params={"label": f"{MACHINE_LABEL}={machine_id}"}):
            _call(settings, "DELETE", f"/v1/pods/{pod['id']}")
        _call(settings, "DELETE", f"/v1/secrets/{secret_name(machine_id)}")

    @hookimpl
    def levers9_terminate(self, pool: Pool, machine: Machine) -> None:
        settings = _settings(pool)
        _call(settings, "DELETE", f"/v1/pods/{machine.provider_id}")
        secret = machine.provider_data.get("secret") or (machine.machine_id and secret_name(machine.machine_id))
        if secret:
            _call(settings, "DELETE", f"/v1/secrets/{secret}")

    @hookimpl
    def levers9_list_machines(self, pool: Pool) -> list[Machine]:
        pods = _call(_settings(pool), "GET", "/v1/pods", params={"label": f"{POOL_LABEL}={pool.name}"})
        return [_machine(pod) for pod in pods]


#: what the entry point ``podmarket = "levers9_podmarket:plugin"`` names
plugin = PodMarketProvider()
