"""A fake cloud's instances, for a provider's tests: what the wire fake of your cloud's API keeps and a test checks.

A provider's end-to-end test needs a stand-in for its cloud: a fake of the
cloud's API, at the wire (an HTTP server the plugin's SDK talks to), that
starts no machine but keeps instances, and a harness that boots them
(:class:`levers9.testing.cloud_boot.CloudBooter`). :class:`FakeCloud` is the
part every such fake repeats: the instances, each with an id, a state, a
region and zone, an instance type and its GPUs, the user data it was started
with and its tags; the faults a provider's tests need (a create that fails
after it created the instance, an instance preempted or failed, an operation
refused once); and the view the booter reads (:meth:`FakeCloud.instances`
is a booter source as it is). Your wire fake translates your API's requests
into its methods and its instances into your API's answers.

States: ``pending`` (created, not yet booted; :meth:`FakeCloud.start` makes
it ``running``), ``running`` (booted: the booter runs its user data),
``stopping``, ``terminated``, ``preempted`` (the cloud took it back, as a spot
instance outbid) and ``failed`` (the machine broke). A terminated, preempted
or failed instance is :attr:`FakeInstance.gone`: nothing runs on it, the
booter stops its boot, and it counts as nothing left behind.

Invariants: every method holds one lock, so the fake may be called from the
server thread your wire fake answers on, the booter's thread and the test at
once; instances are immutable snapshots (:class:`FakeInstance`), so what a
caller holds never changes under it; ids are unique for the fake's life and
never reused. An injected fault fires once, on the next call of its
operation, whoever makes it.

Failures: an operation on an unknown instance raises :class:`FakeCloudError`
with code ``not-found``; an injected fault raises :class:`FakeCloudError` with
the code and message it was given (map it to the error your real API returns
for it, so your plugin sees what it would see); a state outside
:data:`STATES` raises ``ValueError`` naming the accepted ones.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

__all__ = ["STATES", "FakeCloud", "FakeCloudError", "FakeInstance", "Operation"]

#: every state an instance can be in
STATES = ("pending", "running", "stopping", "terminated", "preempted", "failed")
#: the states of an instance nothing runs on any more
GONE = frozenset({"terminated", "preempted", "failed"})
#: what a fault can be injected into
Operation = Literal["create", "start", "tag", "terminate", "list"]
_OPERATIONS = ("create", "start", "tag", "terminate", "list")


class FakeCloudError(Exception):
    """What the fake answers instead of doing an operation: ``code`` (``not-found``, or an injected fault's)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


@dataclass(frozen=True)
class FakeInstance:
    """One instance of the fake cloud, as it was when the caller asked (a snapshot)."""

    id: str
    state: str
    user_data: str = ""
    tags: dict[str, str] = field(default_factory=dict)
    region: str | None = None
    zone: str | None = None
    instance_type: str | None = None
    #: the catalog type of its GPUs and how many (None, 0: a CPU machine); the booter gives it their nvidia-smi
    gpu: str | None = None
    gpu_count: int = 0
    #: why it is preempted or failed, as the cloud would say
    reason: str | None = None
    created_at: float = 0.0

    @property
    def running(self) -> bool:
        """Booted: what runs on a real machine (its user data) runs."""
        return self.state == "running"

    @property
    def gone(self) -> bool:
        """Terminated, preempted or failed: nothing runs on it any more."""
        return self.state in GONE


@dataclass
class _Fault:
    code: str
    message: str
    #: the operation takes effect first, then the call fails (a create that made the instance and then timed out)
    after: bool


class FakeCloud:
    """Instances in memory, with faults to inject (see the module docstring)."""

    def __init__(self, *, prefix: str = "i-", boot: bool = True) -> None:
        #: instance ids are ``<prefix><8 hex digits>``
        self.prefix = prefix
        #: a created instance is ``running`` at once (False: ``pending`` until :meth:`start`)
        self.boot = boot
        self._lock = threading.Lock()
        self._instances: dict[str, FakeInstance] = {}
        self._faults: dict[str, _Fault] = {}
        self._calls: Counter[str] = Counter()
        self._ids = itertools.count(1)

    # ------------------------------------------------------------------ faults

    def fail_next(
        self, operation: Operation, *, code: str = "InternalError", message: str = "injected fault", after: bool = False
    ) -> None:
        """Make the next ``operation`` raise :class:`FakeCloudError` (``code``, ``message``), once.

        ``after=True``: the operation takes effect first (``create``: the instance exists, and runs), then the
        call fails, as a create whose answer was lost, or whose second step failed, leaves an instance behind.
        """
        if operation not in _OPERATIONS:
            raise ValueError(f"operation {operation!r}: faults can be injected into {', '.join(_OPERATIONS)}")
        with self._lock:
            self._faults[operation] = _Fault(code, message, after)

    def _fault(self, operation: str, after: bool) -> None:
        fault = self._faults.get(operation)
        if fault is not None and fault.after == after:
            del self._faults[operation]
            raise FakeCloudError(fault.code, fault.message)

    def calls(self, operation: Operation) -> int:
        """How many times ``operation`` was asked (failed calls included)."""
        with self._lock:
            return self._calls[operation]

    # ------------------------------------------------------------------ the API

    def create(
        self,
        *,
        user_data: str = "",
        tags: dict[str, str] | None = None,
        region: str | None = None,
        zone: str | None = None,
        instance_type: str | None = None,
        gpu: str | None = None,
        gpu_count: int = 0,
    ) -> FakeInstance:
        """A new instance, ``running`` (``pending`` when the fake was made with ``boot=False``)."""
        with self._lock:
            self._calls["create"] += 1
            self._fault("create", after=False)
            instance = FakeInstance(
                id=f"{self.prefix}{next(self._ids):08x}",
                state="running" if self.boot else "pending",
                user_data=user_data,
                tags=dict(tags or {}),
                region=region,
                zone=zone,
                instance_type=instance_type,
                gpu=gpu,
                gpu_count=gpu_count if gpu else 0,
                created_at=time.time(),
            )
            self._instances[instance.id] = instance
            self._fault("create", after=True)
            return instance

    def get(self, instance_id: str) -> FakeInstance:
        with self._lock:
            return self._get(instance_id)

    def _get(self, instance_id: str) -> FakeInstance:
        try:
            return self._instances[instance_id]
        except KeyError:
            raise FakeCloudError("not-found", f"no instance {instance_id}") from None

    def _change(self, operation: str, instance_id: str, change: Callable[[FakeInstance], FakeInstance]) -> FakeInstance:
        with self._lock:
            self._calls[operation] += 1
            instance = self._get(instance_id)
            self._fault(operation, after=False)
            self._instances[instance_id] = instance = change(instance)
            self._fault(operation, after=True)
            return instance

    def start(self, instance_id: str) -> FakeInstance:
        """A ``pending`` instance boots: ``running``."""
        return self._change("start", instance_id, lambda i: replace(i, state="running"))

    def tag(self, instance_id: str, tags: dict[str, str]) -> FakeInstance:
        """Add ``tags`` to the instance (a provider's second step after create, on many clouds)."""
        return self._change("tag", instance_id, lambda i: replace(i, tags={**i.tags, **tags}))

    def terminate(self, instance_id: str) -> FakeInstance:
        """``terminated``; terminating a gone instance changes nothing (preempted stays preempted)."""
        return self._change("terminate", instance_id, lambda i: i if i.gone else replace(i, state="terminated"))

    def instances(self) -> list[FakeInstance]:
        """Every instance, gone ones too, oldest first: a :class:`~levers9.testing.cloud_boot.CloudBooter` source."""
        with self._lock:
            self._calls["list"] += 1
            self._fault("list", after=False)
            return list(self._instances.values())

    # ------------------------------------------------------------------ what the cloud does by itself

    def set_state(self, instance_id: str, state: str, reason: str | None = None) -> FakeInstance:
        """Put the instance in ``state`` (one of :data:`STATES`), as the cloud would on its own."""
        if state not in STATES:
            raise ValueError(f"state {state!r}: an instance is one of {', '.join(STATES)}")
        with self._lock:
            instance = self._get(instance_id)
            self._instances[instance_id] = instance = replace(instance, state=state, reason=reason)
            return instance

    def preempt(self, instance_id: str, reason: str = "the spot price rose above the bid") -> FakeInstance:
        """The cloud takes the instance back (a spot instance outbid): ``preempted``."""
        return self.set_state(instance_id, "preempted", reason)

    def fail(self, instance_id: str, reason: str = "the host's hardware failed") -> FakeInstance:
        """The machine breaks: ``failed``."""
        return self.set_state(instance_id, "failed", reason)

    # ------------------------------------------------------------------ for the test's checks

    def live(self) -> list[FakeInstance]:
        """Instances not gone: what a test that cleaned up must find none of."""
        with self._lock:
            return [i for i in self._instances.values() if not i.gone]

    def terminate_all(self) -> None:
        """Terminate every live instance (a test's last resort, so nothing is booted on)."""
        with self._lock:
            for instance_id, instance in self._instances.items():
                if not instance.gone:
                    self._instances[instance_id] = replace(instance, state="terminated")
