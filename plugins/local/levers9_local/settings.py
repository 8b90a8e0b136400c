"""Pool settings of the ``local`` provider: levers9 workers as processes on the controlplane's machine."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from levers9.config.fields import UniqueList


def _check_command(value: list[str] | None) -> list[str] | None:
    if value is not None:
        if not value:
            raise ValueError("worker_command must name a program")
        if any(not part for part in value):
            raise ValueError("worker_command must not contain empty arguments")
    return value


class LocalSettings(BaseModel):
    """Settings of a pool whose workers are child processes of ``levers9 server`` (or ``levers9 up``).

    How many workers, and the CPU and memory each reports, are the pool's own
    ``max_workers``, ``cpu`` and ``memory``; they are not repeated here.
    """

    model_config = ConfigDict(extra="forbid")

    worker_command: Annotated[list[str] | None, AfterValidator(_check_command)] = Field(
        None,
        description="Command that starts one worker, as an argument list. Left out: the 'levers9 worker' "
        "command of this installation. The machine's join token is passed in a 0600 file named by LEVERS9_TOKEN_FILE, never as an argument.",
    )
    state_dir: Path | None = Field(
        None,
        description="Directory for the workers' pid files and logs. Left out: $XDG_STATE_HOME/levers9/local "
        "(~/.local/state/levers9/local).",
    )
    visible_gpus: UniqueList[Annotated[int, Field(ge=0)]] | None = Field(
        None,
        description="Indices of the GPUs local workers may be given (as CUDA_VISIBLE_DEVICES); left out, "
        "every GPU discovery finds. Each GPU goes to at most one worker at a time.",
    )
    stop_grace_s: float = Field(
        10.0,
        ge=0,
        le=600,
        description="On terminate, seconds between SIGTERM to the worker's process group and SIGKILL.",
    )
