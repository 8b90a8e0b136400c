"""The levers9 SDK: decorate a function, call it remotely.

    import levers9

    @levers9.function(gpu=["H100", "A100-80", "cpu"])
    def embed(text: str) -> list[float]: ...

    embed.remote("hello")
    list(embed.map(texts))

Names load on first use, so ``levers9.sdk.context`` (which the CLI reads on
every client command) does not pull in gRPC.

The modules, by what they hold:

- :mod:`~levers9.sdk.functions`: ``@levers9.function``, :class:`Function` (registering its stub, its
  ``remote``/``spawn``/``map`` methods) and ``register``;
- :mod:`~levers9.sdk.options`: the decorators' options, checked against the controlplane's bounds and
  serialised into the ``StubConfig`` it stores;
- :mod:`~levers9.sdk.kinds`: the deployable kinds: ``endpoint`` (and ``asgi``), ``queue``, ``job``, ``box``;
- :mod:`~levers9.sdk.calls`: one call, :class:`FunctionCall`, outcomes and remote tracebacks, watches that
  ride out a controlplane restart, big payloads as blobs;
- :mod:`~levers9.sdk.mapping`: ``map``'s windowed, batched submission and in-order results;
- :mod:`~levers9.sdk.client`: the connection to a controlplane and its event loop thread;
- :mod:`~levers9.sdk.channel`: gRPC channel options, targets and call metadata;
- :mod:`~levers9.sdk.blobs`: the SDK's name for the chunked payload helpers;
- :mod:`~levers9.sdk.context`: client contexts (``~/.levers9/config``): which controlplane, which token;
- :mod:`~levers9.sdk.serialize`: functions, arguments and results to bytes and back;
- :mod:`~levers9.sdk.errors`: the errors the SDK raises;
- :mod:`~levers9.sdk.lifecycle`: ``levers9.ready()``, for a server that says itself when it is up;
- :mod:`~levers9.sdk.blueprint`: :class:`Blueprint`, the image a function runs in, as a base and build steps;
- :mod:`~levers9.sdk.sandbox`: :class:`Sandbox`, a container driven from Python, and :class:`SandboxInstance`;
  its processes (:mod:`~levers9.sdk.sandbox_process`, :mod:`~levers9.sdk.sandbox_output`), files
  (:mod:`~levers9.sdk.sandbox_files`), REST transport (:mod:`~levers9.sdk.sandbox_http`) and errors
  (:mod:`~levers9.sdk.sandbox_errors`).

Invariants: every public name here stays importable as ``levers9.sdk.NAME``
(and ``levers9.NAME``) wherever it is defined, and importing this package
imports none of the modules above until one of their names is asked for.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from levers9.sdk.blueprint import Blueprint, PythonVersion
    from levers9.sdk.calls import FunctionCall
    from levers9.sdk.errors import (
        CallCancelled,
        CallTimeout,
        ControlPlaneError,
        InvalidFunction,
        RemoteError,
        Unschedulable,
    )
    from levers9.sdk.functions import Function, function, register
    from levers9.sdk.kinds import asgi, box, endpoint, job, queue
    from levers9.sdk.lifecycle import ready
    from levers9.sdk.sandbox import Sandbox, SandboxInstance
    from levers9.sdk.sandbox_errors import (
        SandboxConnectionError,
        SandboxEnded,
        SandboxError,
        SandboxFileSystemError,
        SandboxGone,
        SandboxNotFound,
        SandboxProcessError,
    )
    from levers9.sdk.sandbox_files import SandboxFileInfo, SandboxFileSystem
    from levers9.sdk.sandbox_output import SandboxProcessStream
    from levers9.sdk.sandbox_process import SandboxProcess, SandboxProcessManager, SandboxProcessResponse
    from levers9.sdk.volumes import CloudBucket, CloudBucketConfig, Volume

_WHERE = {
    **dict.fromkeys(
        ["CallCancelled", "CallTimeout", "ControlPlaneError", "InvalidFunction", "RemoteError", "Unschedulable"],
        "levers9.sdk.errors",
    ),
    **dict.fromkeys(["Function", "function", "register"], "levers9.sdk.functions"),
    **dict.fromkeys(["asgi", "box", "endpoint", "job", "queue"], "levers9.sdk.kinds"),
    **dict.fromkeys(["Blueprint", "PythonVersion"], "levers9.sdk.blueprint"),
    "FunctionCall": "levers9.sdk.calls",
    "ready": "levers9.sdk.lifecycle",
    **dict.fromkeys(["CloudBucket", "CloudBucketConfig", "Volume"], "levers9.sdk.volumes"),
    **dict.fromkeys(["Sandbox", "SandboxInstance"], "levers9.sdk.sandbox"),
    **dict.fromkeys(
        [
            "SandboxConnectionError",
            "SandboxEnded",
            "SandboxError",
            "SandboxFileSystemError",
            "SandboxGone",
            "SandboxNotFound",
            "SandboxProcessError",
        ],
        "levers9.sdk.sandbox_errors",
    ),
    **dict.fromkeys(["SandboxFileInfo", "SandboxFileSystem"], "levers9.sdk.sandbox_files"),
    "SandboxProcessStream": "levers9.sdk.sandbox_output",
    **dict.fromkeys(
        ["SandboxProcess", "SandboxProcessManager", "SandboxProcessResponse"], "levers9.sdk.sandbox_process"
    ),
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'levers9.sdk' has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)


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
    "asgi",
    "box",
    "endpoint",
    "function",
    "job",
    "queue",
    "ready",
    "register",
]
