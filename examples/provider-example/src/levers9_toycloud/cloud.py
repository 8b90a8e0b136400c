"""The toy cloud itself: an "API" whose state is a directory, and what its console can do.

The plugin (:mod:`levers9_toycloud`) is this API's only client in production;
tests also use it from the other side, as a cloud's console or its hypervisor
would act, through the functions marked *console* below.

* Instances are JSON records under ``<state_dir>/machines/<zone>/<id>.json``:
  like a zonal cloud API, finding one needs its zone.
* An instance's ``state`` is the cloud's own word (:data:`STATES`), not
  levers9's: ``pending``, ``running``, ``interrupted`` (a spot instance taken
  back), ``error`` (a host fault: it will never run), ``terminated``.
* Starting an instance is two calls, as on most clouds: :func:`create` makes
  an untagged instance, :func:`tag` adds its tags. Between them, an instance
  is running and billed but carries no ``levers9:*`` tag, so no listing by tag
  finds it: a client whose second call fails must terminate what the first
  one created.
* Faults: a file ``<state_dir>/faults/<call>`` (written by :func:`inject_fault`)
  makes every later ``<call>`` of the API fail with :class:`ToyApiError`
  carrying the file's text, until the file is removed.
* A file lock makes concurrent calls from several processes safe, as a real
  cloud API would be.
"""

from __future__ import annotations

import fcntl
import json
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

#: the instance states this cloud reports
STATES = ("pending", "running", "interrupted", "error", "terminated")
#: the calls a fault can be injected into
CALLS = ("create", "tag", "terminate")


class ToyApiError(Exception):
    """An error answer of the toy cloud's API, with its code (what a real SDK's exception carries)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


@contextmanager
def locked(state_dir: str | Path) -> Iterator[Path]:
    """Hold the cloud's lock; yields the directory of instance records."""
    root = Path(state_dir)
    (root / "machines").mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield root / "machines"
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def records(machines: Path, zone: str = "*") -> Iterator[tuple[Path, dict[str, Any]]]:
    """Every instance record of ``zone`` (all zones by default), with its file; the lock must be held."""
    for path in sorted(machines.glob(f"{zone}/*.json")):
        yield path, json.loads(path.read_text())


def _fault(machines: Path, call: str) -> None:
    fault = machines.parent / "faults" / call
    if fault.exists():
        raise ToyApiError("InjectedFault", fault.read_text() or f"{call} failed")


def create(machines: Path, zone: str, fields: dict[str, Any]) -> dict[str, Any]:
    """Start an untagged instance in ``zone``; the lock must be held."""
    _fault(machines, "create")
    record = {"id": f"toy-{uuid.uuid4().hex[:10]}", "state": "running", "created": time.time(), "tags": {}}
    record.update(fields, zone=zone)
    (machines / zone).mkdir(exist_ok=True)
    (machines / zone / f"{record['id']}.json").write_text(json.dumps(record))
    return record


def tag(machines: Path, record: dict[str, Any], tags: dict[str, str]) -> dict[str, Any]:
    """Add ``tags`` to an instance; the lock must be held."""
    _fault(machines, "tag")
    record = {**record, "tags": {**record["tags"], **tags}}
    (machines / record["zone"] / f"{record['id']}.json").write_text(json.dumps(record))
    return record


def terminate(machines: Path, zone: str, instance_id: str) -> None:
    """Terminate an instance (idempotent; an unknown id is no error); the lock must be held."""
    _fault(machines, "terminate")
    for path in machines.glob(f"{zone}/{instance_id}.json"):
        record = json.loads(path.read_text())
        if record["state"] != "terminated":
            record.update(state="terminated", ended=time.time())
            path.write_text(json.dumps(record))


# ------------------------------------------------------------------ console: what tests do from the cloud's side


def instances(state_dir: str | Path) -> list[dict[str, Any]]:
    """*Console*: every instance record the cloud holds, tagged or not, terminated ones included."""
    with locked(state_dir) as machines:
        return [record for _, record in records(machines)]


def user_data_of(state_dir: str | Path, instance_id: str) -> str:
    """*Console*: the user data an instance was started with, as its instance metadata serves it."""
    for record in instances(state_dir):
        if record["id"] == instance_id:
            return str(record["user_data"])
    raise KeyError(f"toycloud has no instance {instance_id}")


def set_state(state_dir: str | Path, instance_id: str, state: str) -> None:
    """*Console*: put an instance in ``state`` (``interrupted``: a spot interruption; ``error``: a host fault)."""
    if state not in STATES:
        raise ValueError(f"toycloud has no instance state {state!r}; it has {', '.join(STATES)}")
    with locked(state_dir) as machines:
        for path, record in records(machines):
            if record["id"] == instance_id:
                record["state"] = state
                if state == "terminated":
                    record["ended"] = time.time()
                path.write_text(json.dumps(record))
                return
    raise KeyError(f"toycloud has no instance {instance_id}")


@contextmanager
def inject_fault(state_dir: str | Path, call: str, message: str = "") -> Iterator[None]:
    """*Console*: make every ``call`` of the API fail while the block runs."""
    if call not in CALLS:
        raise ValueError(f"toycloud has no call {call!r} to fail; it has {', '.join(CALLS)}")
    fault = Path(state_dir) / "faults" / call
    fault.parent.mkdir(parents=True, exist_ok=True)
    fault.write_text(message or f"{call} failed (injected)")
    try:
        yield
    finally:
        fault.unlink(missing_ok=True)
