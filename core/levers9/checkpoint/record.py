"""A checkpoint as the controlplane records it: the record and its status, shared by every layer.

The database's store (:mod:`levers9.state.sql.checkpoints`) returns these, and
the worker, which never touches the database, builds them from the
controlplane's ``CheckpointRef`` answers; so they live here, beside the code
that takes and restores checkpoints, and import nothing but the standard
library. ``levers9.state.sql.records`` re-exports both under their old names.

``path`` is the image's *storage key* (see :func:`levers9.checkpoint.storage.storage_key`),
never a node's local path; a checkpoint may be restored only while it is
``available``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

__all__ = ["CheckpointRecord", "CheckpointStatus"]


class CheckpointStatus(StrEnum):
    #: recorded, its image not yet fully stored
    PENDING = "pending"
    #: stored: any node may restore it
    AVAILABLE = "available"
    #: the image could not be stored
    FAILED = "failed"
    #: a restore of it failed once; no start tries it again
    RESTORE_FAILED = "restore_failed"


@dataclass(frozen=True, slots=True)
class CheckpointRecord:
    id: str
    workspace_id: str
    stub_id: str | None
    task_id: str | None
    status: CheckpointStatus
    runtime: str
    gpu: str | None
    path: str | None
    size_bytes: int | None
    error: str | None
    created_at: datetime
    updated_at: datetime
