"""What a request asks the scheduler for: resources, a GPU preference, and where it may or must go.

It is stored whole in the task's SQL row, so after a restart the backlog is
rebuilt with exactly the constraints the request was submitted with.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from levers9.gpu.preference import GpuRequest

__all__ = ["CheckpointNeed", "PlacementRequest"]


class CheckpointNeed(BaseModel):
    """A checkpoint restores only where it was taken: the same runtime and accelerator type."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    checkpoint_id: str
    runtime: str
    #: canonical GPU type the checkpoint was taken on; None for a CPU checkpoint
    gpu: str | None = None


class PlacementRequest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    #: the task id: one request per attempt of one task
    id: str = Field(pattern=r"^[A-Za-z0-9_.:-]{1,128}$")
    workspace: str
    cpu_millicores: int = Field(1000, ge=1)
    memory_mib: int = Field(1024, ge=1)
    gpu: GpuRequest = Field(default_factory=GpuRequest)
    #: pool labels the request insists on (``{"zone": "eu"}``)
    selector: dict[str, str] = Field(default_factory=dict)
    #: only these pools, when given
    pools: tuple[str, ...] | None = None
    checkpoint: CheckpointNeed | None = None
    #: epoch milliseconds; fallback timing and FIFO order count from here
    submitted_ms: int = Field(ge=0)
    #: give up after this long without a worker (default: the scheduler's max_wait_s)
    max_wait_s: float | None = Field(None, gt=0)

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PlacementRequest:
        return cls.model_validate(data)
