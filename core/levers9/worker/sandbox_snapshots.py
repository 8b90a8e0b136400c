"""A sandbox's memory snapshot: what describes one, where it is stored, and the errors about it.

:meth:`levers9.worker.sandboxes.Sandboxes.snapshot` takes one and :meth:`~levers9.worker.sandboxes.Sandboxes.create`
restores one (``SandboxSpec.snapshot``); this module holds what both share and what the controlplane is
sent back and forth: a :class:`SnapshotInfo`, as JSON (:meth:`SnapshotInfo.fields`, :meth:`SnapshotInfo.of`).

A snapshot is a checkpoint of the sandbox's container, memory and root filesystem changes (see
:mod:`levers9.engine.oci`), stored as one object in the workspace's checkpoint storage (the
``checkpoint_storage_url`` the worker got at registration, :mod:`levers9.checkpoint.storage`) under
:func:`snapshot_key`: ``sandbox-snapshots/<workspace>/<snapshot id>``. Every worker of the pool reads the
same storage, so any of them of the same runtime restores it.

Invariants:

* a :class:`SnapshotInfo` carries the names of the sandbox's environment variables, never their values
  (a secret's value lives only in the snapshot's memory, which only the storage holds);
* its ``key`` is always :func:`snapshot_key` of its workspace and id: :meth:`SnapshotInfo.of` refuses
  another, so a request cannot name an object of another workspace or outside the snapshots' prefix.

Errors: :class:`SnapshotUnavailable` (this sandbox, worker or runtime cannot be snapshotted; the message
says which and what would do), :class:`SnapshotFailed` (the runtime or the storage failed while taking,
storing or deleting one; the sandbox runs on), :class:`SnapshotMissing` (the storage has no object under the key: it was
deleted, or the storage is not the one it was written to).
"""

from __future__ import annotations

import re
import secrets
from dataclasses import asdict, dataclass
from typing import Any

from levers9.worker.warm.launch import StartFailed

__all__ = [
    "KEY_PREFIX",
    "SnapshotFailed",
    "SnapshotInfo",
    "SnapshotMissing",
    "SnapshotUnavailable",
    "new_snapshot_id",
    "snapshot_key",
]

#: the storage keys of sandbox snapshots start with it, apart from function checkpoints' (``<workspace>/...``)
KEY_PREFIX = "sandbox-snapshots"

_ID = re.compile(r"^sbs_[0-9a-f]{16,64}$")


class SnapshotUnavailable(Exception):
    """This sandbox cannot be snapshotted here; the message names why (the runtime, the storage, the sandbox)."""


class SnapshotFailed(Exception):
    """Taking, storing or deleting a snapshot failed in the runtime or the storage; the sandbox runs on."""


class SnapshotMissing(StartFailed):
    """The checkpoint storage has no snapshot under that key (deleted, or another storage): the sandbox did not
    start (a :class:`~levers9.worker.warm.launch.StartFailed`)."""


def new_snapshot_id() -> str:
    return f"sbs_{secrets.token_hex(8)}"


def snapshot_key(workspace_id: str, snapshot_id: str) -> str:
    """Where a snapshot lives in the checkpoint storage."""
    return f"{KEY_PREFIX}/{workspace_id}/{snapshot_id}"


@dataclass(frozen=True)
class SnapshotInfo:
    """One stored snapshot of a sandbox: what to restore it with, and where it is."""

    id: str
    #: the sandbox it was taken of
    sandbox_id: str
    workspace_id: str
    #: the runtime whose checkpoint it is: only a pool of that runtime restores it
    runtime: str
    image: str
    python_version: str
    cpu_millicores: int
    memory_mib: int
    #: the names of the sandbox's environment variables and secrets (their values are only in its memory)
    env_names: tuple[str, ...]
    size_bytes: int
    #: seconds since the epoch
    created_at: float
    #: the storage key (:func:`snapshot_key`)
    key: str

    def fields(self) -> dict[str, Any]:
        """As JSON."""
        out = asdict(self)
        out["env_names"] = list(self.env_names)
        return out

    @classmethod
    def of(cls, value: object) -> SnapshotInfo:
        """A snapshot from its JSON (a create request's ``snapshot``); ValueError naming the field that is wrong."""
        if not isinstance(value, dict):
            raise ValueError(f"snapshot is {type(value).__name__}; give the snapshot's object as it was answered")
        kinds: dict[str, type | tuple[type, ...]] = {
            "id": str,
            "sandbox_id": str,
            "workspace_id": str,
            "runtime": str,
            "image": str,
            "python_version": str,
            "cpu_millicores": int,
            "memory_mib": int,
            "size_bytes": int,
            "created_at": (int, float),
            "key": str,
        }
        for name, kind in kinds.items():
            field_value = value.get(name)
            if not isinstance(field_value, kind) or isinstance(field_value, bool):
                raise ValueError(f"snapshot.{name} is {field_value!r}; the snapshot's object as it was answered has it")
        names = value.get("env_names", [])
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ValueError("snapshot.env_names must be a list of names")
        if not _ID.match(value["id"]):
            raise ValueError(f"snapshot.id is {value['id']!r}; a snapshot id is sbs_ and hex digits")
        if value["key"] != snapshot_key(value["workspace_id"], value["id"]):
            raise ValueError(
                f"snapshot.key is {value['key']!r}; a snapshot of workspace {value['workspace_id']!r} is stored at "
                f"{snapshot_key(value['workspace_id'], value['id'])!r}"
            )
        return cls(
            id=value["id"],
            sandbox_id=value["sandbox_id"],
            workspace_id=value["workspace_id"],
            runtime=value["runtime"],
            image=value["image"],
            python_version=value["python_version"],
            cpu_millicores=value["cpu_millicores"],
            memory_mib=value["memory_mib"],
            env_names=tuple(names),
            size_bytes=value["size_bytes"],
            created_at=float(value["created_at"]),
            key=value["key"],
        )
