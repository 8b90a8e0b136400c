"""What a worker is asked to run and what it reports back, independent of the wire.

The worker's session turns protobuf messages into these, hands them to the
:class:`~levers9.worker.warm.pool.WarmPool`, and turns the outcomes back into
messages; the pool never sees gRPC and the session never sees a container.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from levers9.worker.volumes import VolumeSpec

__all__ = [
    "SANDBOX_KIND",
    "SERVING_KINDS",
    "Call",
    "Outcome",
    "RemoteErrorInfo",
    "Serving",
    "StubSpec",
    "cancelled_outcome",
    "error_outcome",
]

#: stubs whose containers serve requests the gateway proxies, rather than run calls
SERVING_KINDS = ("endpoint", "box")
#: a stub of this kind is a sandbox's: its containers run no handler (levers9.runner.sandbox)
SANDBOX_KIND = "sandbox"


@dataclass(frozen=True)
class StubSpec:
    """A function as its containers run it; the same for every call of the stub."""

    stub_id: str
    workspace_id: str
    name: str
    #: "host" or a local image path the runtime can resolve
    image: str
    #: the cloudpickled handler; loaded only inside the container, never by the worker
    handler: bytes
    #: "3.11": the Python the handler was pickled with
    python_version: str
    cpu_millicores: int
    memory_mib: int
    gpu_count: int = 0
    env: dict[str, str] = field(default_factory=dict)
    #: decrypted workspace secrets, given to the container as environment variables; never logged
    secret_env: dict[str, str] = field(default_factory=dict, repr=False)
    #: seconds an idle container is kept for the next call of this stub
    keep_warm_s: float = 60.0
    #: snapshot the first container once loaded; later ones start from the snapshot
    checkpoint_enabled: bool = False
    #: function and job: calls over the runner's frames; endpoint and box: a container per call that serves;
    #: sandbox: no handler, the runner serves processes and files (levers9.runner.sandbox_wire)
    kind: str = "function"
    #: endpoints: "function" or "asgi", how the container answers HTTP
    interface: str = "function"
    #: endpoints: requests one container serves at once
    tasks_per_container: int = 1
    #: boxes: the ports that must accept connections before the box is ready
    ports: tuple[int, ...] = ()
    #: the volumes and cloud buckets its containers mount
    volumes: tuple[VolumeSpec, ...] = ()

    @property
    def serves(self) -> bool:
        """Whether a call of this stub is a container that serves HTTP until it is stopped."""
        return self.kind in SERVING_KINDS


@dataclass(frozen=True)
class Call:
    task_id: str
    #: cloudpickled (args, kwargs); opaque to the worker
    args: bytes
    #: seconds the call may run; 0 means no limit
    timeout_s: float = 0.0
    attempt: int = 0


@dataclass(frozen=True)
class RemoteErrorInfo:
    type: str
    message: str
    traceback: str = ""


@dataclass(frozen=True)
class Outcome:
    task_id: str
    #: complete, error, cancelled or timeout
    status: str
    #: cloudpickled return value (complete), or the cloudpickled exception when it could be pickled (error)
    result: bytes = b""
    error: RemoteErrorInfo | None = None


@dataclass(frozen=True)
class Serving:
    """Where a serving container answers, as reachable from the worker's host."""

    container_id: str
    #: host:port of an endpoint's HTTP server ("" for a box)
    address: str = ""
    #: a box's ports: container port -> host:port
    ports: dict[int, str] = field(default_factory=dict)


def error_outcome(call: Call, kind: str, message: str, status: str = "error") -> Outcome:
    """The outcome of a call that failed in the worker (not in the function): ``kind`` names what went wrong."""
    return Outcome(task_id=call.task_id, status=status, error=RemoteErrorInfo(type=kind, message=message))


def cancelled_outcome(call: Call, reason: str) -> Outcome:
    return error_outcome(call, "Cancelled", reason, "cancelled")
