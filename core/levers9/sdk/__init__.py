"""The levers9 SDK: decorate a function, call it remotely.

    import levers9

    @levers9.function(gpu=["H100", "A100-80", "cpu"])
    def embed(text: str) -> list[float]: ...

    embed.remote("hello")
    list(embed.map(texts))

Names load on first use, so ``levers9.sdk.context`` (which the CLI reads on
every client command) does not pull in gRPC.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from levers9.sdk.errors import (
        CallCancelled,
        CallTimeout,
        ControlPlaneError,
        InvalidFunction,
        RemoteError,
        Unschedulable,
    )
    from levers9.sdk.functions import Function, FunctionCall, asgi, box, endpoint, function, job, queue, register
    from levers9.sdk.lifecycle import ready

_WHERE = {
    **dict.fromkeys(
        ["CallCancelled", "CallTimeout", "ControlPlaneError", "InvalidFunction", "RemoteError", "Unschedulable"],
        "levers9.sdk.errors",
    ),
    **dict.fromkeys(
        ["Function", "FunctionCall", "asgi", "box", "endpoint", "function", "job", "queue", "register"],
        "levers9.sdk.functions",
    ),
    "ready": "levers9.sdk.lifecycle",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'levers9.sdk' has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)


__all__ = [
    "CallCancelled",
    "CallTimeout",
    "ControlPlaneError",
    "Function",
    "FunctionCall",
    "InvalidFunction",
    "RemoteError",
    "Unschedulable",
    "asgi",
    "box",
    "endpoint",
    "function",
    "job",
    "queue",
    "ready",
    "register",
]
