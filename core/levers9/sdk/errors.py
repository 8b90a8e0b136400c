"""What the SDK raises: a user catches these by kind, and each message says what to do."""

from __future__ import annotations

from levers9.hooks.errors import Levers9Error

__all__ = [
    "BuildFailed",
    "CallCancelled",
    "CallTimeout",
    "ControlPlaneError",
    "InvalidFunction",
    "RemoteError",
    "RemoteTraceback",
    "Unschedulable",
]


class ControlPlaneError(Levers9Error):
    """The controlplane could not be reached or refused the call; the message says why."""


class InvalidFunction(ControlPlaneError, ValueError):
    """The function's definition can never run (an unknown GPU type, a missing secret...)."""


class Unschedulable(ControlPlaneError):
    """No configured pool can run the call, or none could within its wait; the message lists the pools."""


class BuildFailed(Levers9Error):
    """A blueprint's image could not be built; the message names the step, its exit code and its last output."""


class CallTimeout(Levers9Error, TimeoutError):
    """The call ran past its ``timeout`` and was stopped."""


class CallCancelled(Levers9Error):
    """The call was cancelled before it finished."""


class RemoteError(Levers9Error):
    """An exception raised remotely whose own type could not be rebuilt here (not importable, not picklable)."""

    def __init__(self, type_name: str, message: str) -> None:
        super().__init__(f"{type_name}: {message}")
        self.type_name = type_name
        self.message = message


class RemoteTraceback(Exception):
    """Carries the remote traceback as the ``__cause__`` of a re-raised exception, so Python prints both."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return "\n\nRemote traceback (the call ran on a levers9 worker):\n" + self.text.rstrip()
