"""A worker's own queue: the calls the scheduler placed on it beyond the room it has now.

The scheduler queues a CPU-only call of a short function on a worker whose room is all taken
(``state/redis/lua/place.lua``) and counts it as holding no room there; when room on that worker frees, it
moves the oldest waiting call that fits into it, stopping at the first that does not (``common.lua``,
``promote``). :class:`Admission` applies the same rule here, to the same numbers (the room the scheduler counts
this worker as having, from ``RegisterResponse``), so both agree on what runs:

* a call sent without ``queued`` starts at once: the scheduler reserved its room;
* a call sent ``queued`` waits, in the order received, and starts once the calls running here leave room for
  its CPU and memory.

The worker sees a call end before the scheduler does, so a queued call starts here one report's round trip
before the scheduler counts it as running: that round trip is what the queue saves. A worker that drains drops
its queue (:meth:`Admission.clear`): the scheduler puts those calls back on the backlog when the worker leaves.
A room of 0 (a controlplane that does not say) starts every call at once, as a worker without a queue does.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["MAX_QUEUED", "Admission"]

#: how many queued calls this worker says it holds at Register (the scheduler's ``worker_queue`` caps it)
MAX_QUEUED = 256


class Admission:
    """Which calls run here, and which wait for room (see the module docstring)."""

    def __init__(self) -> None:
        self.cpu_millicores = 0
        self.memory_mib = 0
        #: calls started here: task id -> (CPU millicores, memory MiB)
        self._held: dict[str, tuple[int, int]] = {}
        #: calls waiting, oldest first: task id -> (CPU, memory, what starts it)
        self._waiting: dict[str, tuple[int, int, Callable[[], None]]] = {}
        self._used = [0, 0]

    def set_room(self, cpu_millicores: int, memory_mib: int) -> None:
        """The room the scheduler counts this worker as having (0: unknown, start everything at once)."""
        self.cpu_millicores, self.memory_mib = max(0, cpu_millicores), max(0, memory_mib)
        self._admit()

    @property
    def waiting(self) -> list[str]:
        return list(self._waiting)

    def holds(self, task_id: str) -> bool:
        return task_id in self._held or task_id in self._waiting

    def start(self, task_id: str, cpu: int, memory: int, *, queued: bool, run: Callable[[], None]) -> None:
        """Run ``task_id`` now, or (``queued``) once the room frees; ``run`` starts it."""
        if not queued:
            self._hold(task_id, cpu, memory)
            run()
            return
        self._waiting[task_id] = (max(0, cpu), max(0, memory), run)
        self._admit()

    def ended(self, task_id: str) -> None:
        """A call that ran here ended: its room goes to the waiting calls."""
        held = self._held.pop(task_id, None)
        if held is not None:
            self._used[0] -= held[0]
            self._used[1] -= held[1]
        self._admit()

    def drop(self, task_id: str) -> bool:
        """Forget a waiting call (cancelled); False when it is not waiting here."""
        return self._waiting.pop(task_id, None) is not None

    def clear(self) -> list[str]:
        """Drop every waiting call (the worker drains); their ids."""
        dropped = list(self._waiting)
        self._waiting.clear()
        return dropped

    def _hold(self, task_id: str, cpu: int, memory: int) -> None:
        if task_id not in self._held:
            self._held[task_id] = (max(0, cpu), max(0, memory))
            self._used[0] += max(0, cpu)
            self._used[1] += max(0, memory)

    def _fits(self, cpu: int, memory: int) -> bool:
        if not self.cpu_millicores:
            return True
        return self._used[0] + cpu <= self.cpu_millicores and self._used[1] + memory <= self.memory_mib

    def _admit(self) -> None:
        while self._waiting:
            task_id, (cpu, memory, run) = next(iter(self._waiting.items()))
            if not self._fits(cpu, memory):
                return  # the oldest waits for room; none behind it overtakes it (the scheduler's rule too)
            del self._waiting[task_id]
            self._hold(task_id, cpu, memory)
            run()
