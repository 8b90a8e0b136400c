"""What code running inside a levers9 container can tell its worker."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["ready"]

#: set by the worker in containers it may checkpoint; the file to create once start-up is done
#: (the runner's ENV_READY, spelled out so the SDK imports nothing of the worker; a test keeps them equal)
READY_ENV = "LEVERS9_READY_FILE"


def ready() -> bool:
    """Say start-up is done (models loaded, caches warm): the worker may checkpoint the container now.

    Function containers are checkpointed once their function is loaded without
    this; a server or a long-running program that does its own start-up calls it
    when it is ready to serve. Returns False, doing nothing, outside a container
    levers9 may checkpoint, so it is safe to call anywhere.
    """
    path = os.environ.get(READY_ENV)
    if not path:
        return False
    Path(path).touch()
    return True
