"""Source of a provider plugin whose answers the test controls, installed as a real distribution.

Its machines and its behaviour live in a directory: ``behaviour.json`` maps a
GPU type (or ``cpu``) to what ``levers9_provision`` does next, and every call is
appended to ``calls.jsonl`` so a test can check the order of attempts.
"""

SOURCE = """
from __future__ import annotations

import fcntl
import json
import threading
import time
import uuid
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from levers9 import hookimpl
from levers9.hooks.errors import AuthenticationFailed, InsufficientCapacity, QuotaExceeded, Throttled
from levers9.hooks.types import Machine, MachineState, Pool, ProvisionRequest


class FlakySettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    state_dir: str


_lock = threading.Lock()


def _dir(pool: Pool) -> Path:
    root = Path(pool.settings.state_dir)
    (root / "machines").mkdir(parents=True, exist_ok=True)
    return root


def _behaviour(root: Path, kind: str) -> str:
    path = root / "behaviour.json"
    table = json.loads(path.read_text()) if path.exists() else {}
    action = table.get(kind, "ok")
    if action.startswith("throttle:"):
        left = int(action.split(":")[1])
        table[kind] = "ok" if left <= 1 else f"throttle:{left - 1}"
        path.write_text(json.dumps(table))
        return "throttle"
    return action


def _machine(record: dict) -> Machine:
    return Machine(
        provider_id=record["id"], machine_id=record.get("machine_id"), pool=record["pool"],
        state=MachineState.RUNNING, gpu=record.get("gpu"), gpu_count=record.get("gpu_count", 0),
    )


@hookimpl
def levers9_provider_settings():
    return FlakySettings


@hookimpl
def levers9_provision(request: ProvisionRequest) -> Machine:
    root = _dir(request.pool)
    kind = request.resources.gpu or "cpu"
    with _lock:
        action = _behaviour(root, kind)
        with open(root / "calls.jsonl", "a") as log:
            log.write(json.dumps({"pool": request.pool.name, "gpu": kind, "action": action}) + "\\n")
    if action == "capacity":
        raise InsufficientCapacity(f"no {kind} capacity in the test region", code="OutOfCapacity")
    if action == "quota":
        raise QuotaExceeded(f"{kind} quota is 0", code="QuotaExceeded")
    if action == "throttle":
        raise Throttled("slow down", code="TooManyRequests", retry_after=0.05)
    if action == "auth":
        raise AuthenticationFailed("bad key", code="NotAuthenticated")
    if action == "crash":
        raise RuntimeError("plugin bug")
    if action.startswith("hang:"):
        time.sleep(float(action.split(":")[1]))  # past the deadline; the machine still appears
    record = {"id": "fk-" + uuid.uuid4().hex[:8], "machine_id": request.machine_id, "pool": request.pool.name,
              "gpu": request.resources.gpu, "gpu_count": request.resources.gpu_count}
    (root / "machines" / f"{record['id']}.json").write_text(json.dumps(record))
    return _machine(record)


@hookimpl
def levers9_terminate(pool: Pool, provider_id: str) -> None:
    (_dir(pool) / "machines" / f"{provider_id}.json").unlink(missing_ok=True)


@hookimpl
def levers9_list_machines(pool: Pool) -> list[Machine]:
    records = [json.loads(p.read_text()) for p in sorted((_dir(pool) / "machines").glob("*.json"))]
    return [_machine(r) for r in records if r["pool"] == pool.name]
"""
