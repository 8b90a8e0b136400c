"""A worker's own queue (levers9.worker.admission): the scheduler's rule for waiting calls, applied on the worker."""

from __future__ import annotations

import functools

from levers9.worker.admission import Admission


def test_queued_calls_start_in_order_as_room_frees_and_none_overtakes_the_oldest() -> None:
    started: list[str] = []
    room = Admission()
    room.set_room(2000, 4096)

    def start(task_id: str, cpu: int, *, queued: bool) -> None:
        room.start(task_id, cpu, 512, queued=queued, run=lambda: started.append(task_id))

    start("a", 1000, queued=False)
    start("b", 1000, queued=False)
    start("big", 2000, queued=True)
    start("small", 500, queued=True)
    assert started == ["a", "b"]
    assert room.waiting == ["big", "small"]
    room.ended("a")  # 1000 free: "big" does not fit and "small" does not overtake it
    assert started == ["a", "b"]
    room.ended("b")
    assert started == ["a", "b", "big"]
    room.ended("big")
    assert started == ["a", "b", "big", "small"]
    assert room.waiting == []


def test_a_call_sent_without_queued_starts_at_once_even_past_the_room() -> None:
    """The scheduler reserved its room; the worker may not have seen the call that freed it end yet."""
    started: list[str] = []
    room = Admission()
    room.set_room(1000, 1024)
    room.start("a", 1000, 512, queued=False, run=lambda: started.append("a"))
    room.start("b", 1000, 512, queued=False, run=lambda: started.append("b"))
    room.start("c", 500, 512, queued=True, run=lambda: started.append("c"))
    assert started == ["a", "b"]
    room.ended("a")
    assert started == ["a", "b"]  # b still holds all the room
    room.ended("b")
    assert started == ["a", "b", "c"]


def test_cancelled_and_drained_calls_leave_the_queue_unstarted() -> None:
    started: list[str] = []
    room = Admission()
    room.set_room(1000, 1024)
    room.start("run", 1000, 512, queued=False, run=lambda: started.append("run"))
    for task_id in ("x", "y", "z"):
        room.start(task_id, 500, 512, queued=True, run=functools.partial(started.append, task_id))
    assert room.holds("x")
    assert room.drop("x")
    assert not room.drop("x")
    assert room.clear() == ["y", "z"]
    room.ended("run")
    assert started == ["run"]
    assert not room.holds("y")


def test_without_a_room_from_the_controlplane_every_call_starts_at_once() -> None:
    started: list[str] = []
    room = Admission()
    for task_id in ("a", "b", "c"):
        room.start(task_id, 4000, 512, queued=True, run=functools.partial(started.append, task_id))
    assert started == ["a", "b", "c"]
