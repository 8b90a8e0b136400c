"""Source of a provider plugin whose answers the test controls, installed as a real distribution.

Its machines and its behaviour live in a directory:

- ``behaviour.json`` maps an offer key (``GpuOffer.key``), else a GPU type (or
  ``cpu``), to what ``levers9_provision`` does next;
- ``offers.json`` maps a pool name to the offers ``levers9_gpu_offers`` returns
  for it (``GpuOffer`` fields); a pool not in it has no offers;
  ``offers_slow.json`` maps a pool name to how that listing misbehaves:
  ``delay_s`` (it answers that late) and ``error`` (it then raises ``Throttled``);
- every provision is appended to ``calls.jsonl`` (with its time, the offer and
  the bootstrap, never the token) so a test can check the order and pace of
  attempts, and every terminate to ``terminates.jsonl`` with the machine it got;
- ``machines/*.json`` are the machines it runs; a test edits one to make the
  provider report it ``preempted`` or ``failed`` (``state`` and ``reason``).
"""

SOURCE = """
from __future__ import annotations

import fcntl
import json
import os
import threading
import time
import uuid
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from levers9 import hookimpl
from levers9.hooks.errors import (
    AuthenticationFailed, BillingRefused, InsufficientCapacity, PermissionDenied, QuotaExceeded, Throttled,
)
from levers9.hooks.types import GpuOffer, Machine, MachineState, Pool, ProvisionRequest


class FlakySettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    state_dir: str


_lock = threading.Lock()


def _write(path: Path, text: str) -> None:
    # whole or not at all: the tests read these files while the scheduler's threads write them
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    tmp.write_text(text)
    os.replace(tmp, path)


def _read_records(folder: Path) -> list[dict]:
    records = []
    for path in sorted(folder.glob("*.json")):
        try:
            records.append(json.loads(path.read_text()))
        except FileNotFoundError:  # terminated while listed
            continue
    return records


def _dir(pool: Pool) -> Path:
    root = Path(pool.settings.state_dir)
    (root / "machines").mkdir(parents=True, exist_ok=True)
    return root


def _behaviour(root: Path, kinds: list[str]) -> str:
    path = root / "behaviour.json"
    table = json.loads(path.read_text()) if path.exists() else {}
    kind = next((k for k in kinds if k in table), kinds[-1])
    action = table.get(kind, "ok")
    if action.startswith("throttle:"):
        left = int(action.split(":")[1])
        table[kind] = "ok" if left <= 1 else f"throttle:{left - 1}"
        _write(path, json.dumps(table))
        return "throttle"
    return action


def _append(path: Path, entry: dict) -> None:
    with open(path, "a") as log:
        log.write(json.dumps(entry) + "\\n")


def _machine(record: dict) -> Machine:
    return Machine(
        provider_id=record["id"], machine_id=record.get("machine_id"), pool=record["pool"],
        state=MachineState(record.get("state", "running")), gpu=record.get("gpu"),
        gpu_count=record.get("gpu_count", 0), region=record.get("region"), zone=record.get("zone"),
        instance_type=record.get("instance_type"), provider_data=record.get("provider_data", {}),
        reason=record.get("reason"),
    )


@hookimpl
def levers9_provider_settings():
    return FlakySettings


@hookimpl
def levers9_gpu_offers(pool: Pool) -> list[GpuOffer]:
    slow = _dir(pool) / "offers_slow.json"
    how = json.loads(slow.read_text()).get(pool.name, {}) if slow.exists() else {}
    time.sleep(how.get("delay_s", 0.0))
    if how.get("error"):
        raise Throttled(how["error"], code="Slow")
    path = _dir(pool) / "offers.json"
    table = json.loads(path.read_text()) if path.exists() else {}
    return [GpuOffer(**offer) for offer in table.get(pool.name, [])]


@hookimpl
def levers9_provision(request: ProvisionRequest) -> Machine:
    root = _dir(request.pool)
    offer = request.offer
    gpu = request.resources.gpu or "cpu"
    with _lock:
        action = _behaviour(root, ([offer.key] if offer else []) + [gpu])
        boot = request.bootstrap.model_dump(exclude={"token"})
        _append(root / "calls.jsonl", {
            "pool": request.pool.name, "gpu": gpu, "action": action, "t": time.time(),
            "offer": offer.key if offer else None, "region": request.region, "bootstrap": boot,
            "has_token": bool(request.bootstrap.token),
        })
    if action == "capacity":
        what = offer.key if offer else gpu
        raise InsufficientCapacity(f"no {what} capacity in the test region", code="OutOfCapacity")
    if action == "quota":
        raise QuotaExceeded(f"{gpu} quota is 0", code="QuotaExceeded")
    if action == "quota-account":
        raise QuotaExceeded(f"the account's {gpu} quota is 0", code="AccountQuota", scope="account")
    if action == "billing":
        raise BillingRefused("the account's balance is $0.00; add credit to launch", code="InsufficientBalance")
    if action == "throttle":
        raise Throttled("slow down", code="TooManyRequests", retry_after=0.05)
    if action == "auth":
        raise AuthenticationFailed("bad key", code="NotAuthenticated")
    if action == "denied":
        raise PermissionDenied("not allowed to run instances", code="UnauthorizedOperation")
    if action == "crash":
        raise RuntimeError("plugin bug")
    if action.startswith("hang:"):
        time.sleep(float(action.split(":")[1]))  # past the deadline; the machine still appears
    zone = offer.zone if offer else None
    record = {"id": "fk-" + uuid.uuid4().hex[:8], "machine_id": request.machine_id, "pool": request.pool.name,
              "gpu": request.resources.gpu, "gpu_count": request.resources.gpu_count, "region": request.region,
              "zone": zone, "instance_type": offer.instance_type if offer else None,
              "provider_data": {"zone": zone} if zone else {}}
    _write(root / "machines" / f"{record['id']}.json", json.dumps(record))
    return _machine(record)


@hookimpl
def levers9_terminate(pool: Pool, machine: Machine) -> None:
    root = _dir(pool)
    with _lock:
        _append(root / "terminates.jsonl", machine.model_dump(mode="json", include={
            "provider_id", "machine_id", "pool", "region", "zone", "instance_type", "provider_data",
        }))
    (root / "machines" / f"{machine.provider_id}.json").unlink(missing_ok=True)


@hookimpl
def levers9_list_machines(pool: Pool) -> list[Machine]:
    records = _read_records(_dir(pool) / "machines")
    return [_machine(r) for r in records if r["pool"] == pool.name]
"""
