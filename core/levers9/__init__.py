"""levers9: an open control plane that runs containers on any compute.

This module stays light on purpose: ``levers9 --help`` and every plugin import
it, and so does the runner inside every container, which has the standard
library only: nothing beyond it is imported until a name below is asked for.
Plugins use ``from levers9 import hookimpl``; programs use ``@levers9.function``,
whose SDK is imported the first time it is named.

Inside a user's container this file is mounted as it is, beside the runner and
little else (:data:`levers9.worker.warm.launch.CONTAINER_FILES`): there only
``__version__`` and ``ready`` resolve, and every other name fails with
``ModuleNotFoundError`` (the SDK client and ``hookimpl`` are not there), so this
file must import nothing but ``__about__`` at import time.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from levers9.__about__ import __version__

if TYPE_CHECKING:
    from levers9.hooks.markers import hookimpl
    from levers9.sdk import (
        Blueprint,
        CallCancelled,
        CallTimeout,
        CloudBucket,
        CloudBucketConfig,
        ControlPlaneError,
        Function,
        FunctionCall,
        InvalidFunction,
        PythonVersion,
        RemoteError,
        Sandbox,
        SandboxConnectionError,
        SandboxEnded,
        SandboxError,
        SandboxFileInfo,
        SandboxFileSystem,
        SandboxFileSystemError,
        SandboxGone,
        SandboxInstance,
        SandboxNotFound,
        SandboxProcess,
        SandboxProcessError,
        SandboxProcessManager,
        SandboxProcessResponse,
        SandboxProcessStream,
        Unschedulable,
        Volume,
        asgi,
        box,
        endpoint,
        function,
        job,
        queue,
        ready,
    )

__all__ = [
    "Blueprint",
    "CallCancelled",
    "CallTimeout",
    "CloudBucket",
    "CloudBucketConfig",
    "ControlPlaneError",
    "Function",
    "FunctionCall",
    "InvalidFunction",
    "PythonVersion",
    "RemoteError",
    "Sandbox",
    "SandboxConnectionError",
    "SandboxEnded",
    "SandboxError",
    "SandboxFileInfo",
    "SandboxFileSystem",
    "SandboxFileSystemError",
    "SandboxGone",
    "SandboxInstance",
    "SandboxNotFound",
    "SandboxProcess",
    "SandboxProcessError",
    "SandboxProcessManager",
    "SandboxProcessResponse",
    "SandboxProcessStream",
    "Unschedulable",
    "Volume",
    "__version__",
    "asgi",
    "box",
    "endpoint",
    "function",
    "hookimpl",
    "job",
    "queue",
    "ready",
]

#: the SDK's names (every public name but these two), imported from levers9.sdk on first use
_SDK = frozenset(__all__) - {"__version__", "hookimpl"}


def __getattr__(name: str) -> Any:
    if name == "hookimpl":
        return importlib.import_module("levers9.hooks.markers").hookimpl
    if name in _SDK:
        return getattr(importlib.import_module("levers9.sdk"), name)
    raise AttributeError(f"module 'levers9' has no attribute {name!r}")
