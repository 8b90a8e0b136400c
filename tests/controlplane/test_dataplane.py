"""The data plane on real Services (SQLite and PostgreSQL, embedded Redis): what a worker's report frees and stores."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator, Callable

import pytest

from levers9.scheduler.events import REQUEUE_NEVER_DELIVERED, Requeued
from levers9.services.auth import Principal
from levers9.services.dataplane import DataPlane
from levers9.services.hub import Hub
from levers9.services.reports import TaskOutcome, WorkerReport
from levers9.state.sql.records import CallResult, TokenKind

from .conftest import Api


async def _until(check: Callable[[], object], timeout: float = 10.0) -> None:
    """Until ``check()`` (or what it returns, awaited) is true, within ``timeout`` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not (await answer if inspect.isawaitable(answer := check()) else answer):
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("the condition did not hold within 10 s")
        await asyncio.sleep(0.02)


async def _stored(dp: DataPlane, task_id: str) -> CallResult:
    """The call's outcome, once the flusher has stored it."""

    async def stored() -> bool:
        return bool(await dp.calls.results([task_id]))

    await _until(stored)
    [result] = await dp.calls.results([task_id])
    return result


async def test_a_late_report_from_another_worker_frees_nothing_and_stores_nothing(api: Api) -> None:
    services = api.services
    hub = Hub(services.redis, name="test")
    dp = DataPlane(services, hub)
    workspace, _ = await api.user("team-a")
    me = Principal(token_id="t", kind=TokenKind.USER, workspace_id=workspace.id, subject="someone")
    stub_id, _ = await dp.get_or_create_stub(me, {"name": "f", "cpu_millicores": 2000}, b"pickled handler")
    await api.worker("w1", "cpu")
    await api.worker("w2", "cpu")
    [first, second] = await dp.submit(me, stub_id, [b"a", b"b"])  # each fills a worker
    await services.scheduler.place_once()
    states = await services.scheduler.backlog.get_many([first, second])
    assert [s.state if s else None for s in states] == ["placed", "placed"]
    assert states[0] is not None
    runs_first = states[0].worker
    other = {"w1": "w2", "w2": "w1"}[runs_first]
    try:
        # the other worker reports the first call (a worker presumed dead, reporting late)
        await dp.report(other, WorkerReport(outcomes=[TaskOutcome(first, "complete", b"wrong")]))
        await asyncio.sleep(0.3)
        state = await services.scheduler.workers.get(runs_first)
        assert state is not None
        assert state.running == 1  # still held for the call that runs there
        task = await services.tasks.get(first)
        assert task is not None
        assert task.status.value == "pending"

        # its own worker reports it: the place comes back and the outcome is stored
        await dp.report(runs_first, WorkerReport(outcomes=[TaskOutcome(first, "complete", b"right")]))

        async def freed() -> bool:
            state = await services.scheduler.workers.get(runs_first)
            return state is not None and state.running == 0

        await _until(freed)
        result = await _stored(dp, first)
        assert (result.status, result.result) == ("complete", b"right")
    finally:
        await dp.close()


async def test_a_worker_that_comes_back_through_another_replica_has_its_calls_claimed_there(api: Api) -> None:
    """Replica A dispatched a call and died; the worker registers with B saying what it runs, and B finishes it
    as A would have: a failed attempt of a call with retries left is retried, not stored as the final error."""
    from levers9.services import fleet

    services = api.services
    replica_a = DataPlane(services, Hub(services.redis, name="replica-a"))
    replica_b = DataPlane(services, Hub(services.redis, name="replica-b"))
    workspace, _ = await api.user("team-a")
    me = Principal(token_id="t", kind=TokenKind.USER, workspace_id=workspace.id, subject="someone")
    stub_id, _ = await replica_a.get_or_create_stub(me, {"name": "flaky", "retries": 1}, b"pickled handler")
    await api.worker("w1", "cpu")
    [task_id] = await replica_a.submit(me, stub_id, [b"a"])
    await services.scheduler.place_once()
    try:
        [dispatched] = await replica_a.take("w1")
        assert dispatched.task_id == task_id
        worker = Principal(token_id="w", kind=TokenKind.WORKER, workspace_id=None, subject="cpu")
        done = await fleet.register(
            replica_b,
            worker,
            pool="cpu",
            worker_id="w1",
            gpus=[],
            cpu_millicores=0,
            memory_mib=0,
            hostname="box",
            running=[task_id],
        )
        assert done.worker_id == "w1"  # its registration held: the same worker, still holding the call
        await replica_b.report("w1", WorkerReport(outcomes=[TaskOutcome(task_id, "error", error="boom")]))

        async def retried() -> bool:
            task = await services.tasks.get(task_id)
            return task is not None and task.status.value == "pending" and task.attempts == 1

        await _until(retried)
    finally:
        await replica_a.close()
        await replica_b.close()


async def test_a_call_sent_into_a_breaking_session_goes_back_on_the_backlog_when_the_worker_returns(
    api: Api,
) -> None:
    """Replica A took two calls off the worker's queue and died; only one reached the worker. When the worker
    registers again, the one it does not hold is requeued (and its resources freed); the other stays its own."""
    from levers9.services import fleet

    services = api.services
    replica_a = DataPlane(services, Hub(services.redis, name="replica-a"))
    replica_b = DataPlane(services, Hub(services.redis, name="replica-b"))
    workspace, _ = await api.user("team-a")
    me = Principal(token_id="t", kind=TokenKind.USER, workspace_id=workspace.id, subject="someone")
    stub_id, _ = await replica_a.get_or_create_stub(me, {"name": "f", "cpu_millicores": 500}, b"pickled handler")
    await api.worker("w1", "cpu")
    got, lost = await replica_a.submit(me, stub_id, [b"a", b"b"])
    await services.scheduler.place_once()
    try:
        assert sorted(d.task_id for d in await replica_a.take("w1")) == sorted([got, lost])
        before = await services.scheduler.workers.get("w1")
        assert before is not None
        assert before.running == 2
        worker = Principal(token_id="w", kind=TokenKind.WORKER, workspace_id=None, subject="cpu")
        seen: list[object] = []
        services.scheduler.ctx.on_event = seen.append
        await fleet.register(
            replica_b,
            worker,
            pool="cpu",
            worker_id="w1",
            gpus=[],
            cpu_millicores=0,
            memory_mib=0,
            hostname="box",
            running=[got],
        )
        assert seen == [Requeued(REQUEUE_NEVER_DELIVERED, 1)]  # counted as levers9_requeues_total
        after = await services.scheduler.workers.get("w1")
        assert after is not None
        assert after.running == 1
        [state_got, state_lost] = await services.scheduler.backlog.get_many([got, lost])
        assert state_got is not None
        assert (state_got.state, state_got.worker) == ("running", "w1")
        assert state_lost is not None
        assert state_lost.state in ("queued", "placed")
        task = await services.tasks.get(lost)
        assert task is not None
        assert task.status.value == "pending"
    finally:
        await replica_a.close()
        await replica_b.close()


async def test_a_submission_sent_twice_is_stored_once_and_queued_even_if_the_first_replica_died_before_queueing(
    api: Api,
) -> None:
    """The client's replica went away before answering; the client sends the same submission to another."""
    services = api.services
    replica_a = DataPlane(services, Hub(services.redis, name="replica-a"))
    replica_b = DataPlane(services, Hub(services.redis, name="replica-b"))
    workspace, _ = await api.user("team-a")
    me = Principal(token_id="t", kind=TokenKind.USER, workspace_id=workspace.id, subject="someone")
    stub_id, _ = await replica_a.get_or_create_stub(me, {"name": "f"}, b"pickled handler")
    try:
        ids, replayed = await replica_a.submit_once(me, stub_id, [b"a", b"b"], "client-sub-0001")
        assert not replayed
        # replica A committed the tasks, then died before they reached the backlog
        for task_id in ids:
            await services.scheduler.backlog.finish(task_id, 0)
        again, replayed = await replica_b.submit_once(me, stub_id, [b"a", b"b"], "client-sub-0001")
        assert (again, replayed) == (ids, True)
        states = await services.scheduler.backlog.get_many(ids)
        assert [s.state if s else None for s in states] == ["queued", "queued"]
        tasks = await services.tasks.for_workspace(workspace.id, limit=10)
        assert sorted(t.id for t in tasks) == sorted(ids)  # stored once
        other, _ = await api.user("team-b")
        them = Principal(token_id="u", kind=TokenKind.USER, workspace_id=other.id, subject="else")
        stub_b, _ = await replica_b.get_or_create_stub(them, {"name": "f"}, b"pickled handler")
        theirs, replayed = await replica_b.submit_once(them, stub_b, [b"a"], "client-sub-0001")
        assert not replayed  # the same client id in another workspace names other tasks
        assert theirs[0] not in ids
        with pytest.raises(ValueError, match="submission_id"):
            await replica_b.submit_once(me, stub_id, [b"a"], "bad id!")
    finally:
        await replica_a.close()
        await replica_b.close()


async def test_a_success_reaches_its_callers_watch_before_it_is_stored_and_a_failure_only_after(api: Api) -> None:
    """Write-behind: the outcome of a call sent to this worker is handed to the watch while SQL is held up."""
    services = api.services
    dp = DataPlane(services, Hub(services.redis, name="test"))
    workspace, _ = await api.user("team-a")
    me = Principal(token_id="t", kind=TokenKind.USER, workspace_id=workspace.id, subject="someone")
    stub_id, _ = await dp.get_or_create_stub(me, {"name": "f", "cpu_millicores": 500, "retries": 0}, b"handler")
    await api.worker("w1", "cpu")
    [ok, failing] = await dp.submit(me, stub_id, [b"a", b"b"])
    await services.scheduler.place_once()
    assert sorted(d.task_id for d in await dp.take("w1")) == sorted([ok, failing])
    held = asyncio.Event()
    store = services.tasks.finish_many

    async def held_up(*args: object, **kwargs: object) -> list[str]:  # levers9's own store, gated
        await held.wait()
        return await store(*args, **kwargs)  # type: ignore[arg-type]

    services.tasks.finish_many = held_up  # type: ignore[method-assign]
    try:
        watch = dp.watch(me, [ok, failing], just_submitted=True)
        waiting = asyncio.ensure_future(anext(watch))  # the watch in place, as Invoke has it
        await asyncio.sleep(0)
        await dp.report("w1", WorkerReport(outcomes=[TaskOutcome(ok, "complete", b"value")]))
        first = await asyncio.wait_for(waiting, 10.0)
        assert (first.task_id, first.status, first.result) == (ok, "complete", b"value")
        stored = await services.tasks.get(ok)
        assert stored is not None
        assert stored.status.value == "pending"  # not stored yet: it came before

        await dp.report("w1", WorkerReport(outcomes=[TaskOutcome(failing, "error", error="boom")]))
        second = asyncio.ensure_future(anext(watch))
        await asyncio.sleep(0.3)
        assert not second.done()  # a failure is told only once stored (it could have been retried)
        held.set()
        result = await asyncio.wait_for(second, 10.0)
        assert (result.task_id, result.status) == (failing, "error")

        async def both_stored() -> bool:
            tasks = [await services.tasks.get(t) for t in (ok, failing)]
            return [t.status.value if t else None for t in tasks] == ["complete", "error"]

        await _until(both_stored)
        await watch.aclose()
    finally:
        held.set()
        await dp.close()
        del services.tasks.finish_many  # the store's own method again


async def test_a_worker_cannot_start_log_or_finish_a_call_never_placed_on_it(api: Api) -> None:
    """A registered worker reports on another workspace's pending call: nothing of it is stored or delivered.

    The call asks for an L4, so no CPU worker could ever be given it; before the check, the store took
    the start, the output and the pickled result of any worker of any pool for a task owned by none.
    """
    services = api.services
    dp = DataPlane(services, Hub(services.redis, name="test"), api.metrics)
    victim, _ = await api.user("team-b")
    them = Principal(token_id="t", kind=TokenKind.USER, workspace_id=victim.id, subject="someone")
    stub_id, _ = await dp.get_or_create_stub(them, {"name": "f", "gpu": ["L4"]}, b"pickled handler")
    [task_id] = await dp.submit(them, stub_id, [b"args"])
    await api.worker("w-forged", "cpu")
    watch = dp.watch(them, [task_id])
    delivered = asyncio.ensure_future(anext(watch))
    try:
        await dp.report(
            "w-forged",
            WorkerReport(
                started=[(task_id, "c1")],
                outcomes=[TaskOutcome(task_id, "complete", b"cos\nsystem\n(S'touch /tmp/pwned'\ntR.")],
                logs=[(task_id, b"owned\n")],
            ),
        )

        def refused() -> bool:
            return api.metrics.worker_refusals.labels(replica="local", what="report")._value.get() > 0

        await _until(refused)
        await _until(lambda: dp.reports.idle)  # the flusher has taken (and stored) what it was given
        await asyncio.sleep(0.2)
        task = await services.tasks.get(task_id)
        assert task is not None
        assert (task.status.value, task.worker_id, task.container_id) == ("pending", None, None)
        assert await dp.calls.results([task_id]) == []
        assert not delivered.done()  # the caller's watch got nothing
        state = await services.scheduler.backlog.get(task_id)
        assert state is not None
        assert (state.state, state.worker) == ("queued", None)
    finally:
        delivered.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await delivered
        await watch.aclose()
        await dp.close()


async def test_a_late_report_of_a_call_placed_again_is_not_stored_even_by_the_replica_that_sent_it(api: Api) -> None:
    """The worker the call was sent from here was presumed dead; the call was queued again. Its late outcome is
    dropped on Redis's word (the request is placed on no worker now), whatever this replica remembers of it."""
    services = api.services
    dp = DataPlane(services, Hub(services.redis, name="test"), api.metrics)
    workspace, _ = await api.user("team-a")
    me = Principal(token_id="t", kind=TokenKind.USER, workspace_id=workspace.id, subject="someone")
    stub_id, _ = await dp.get_or_create_stub(me, {"name": "f", "cpu_millicores": 2000}, b"pickled handler")
    await api.worker("w1", "cpu")
    [task_id] = await dp.submit(me, stub_id, [b"a"])
    await services.scheduler.place_once()
    try:
        assert [d.task_id for d in await dp.take("w1")] == [task_id]
        assert await services.scheduler.remove_worker("w1", "was silent", force=True) == [task_id]
        await dp.report("w1", WorkerReport(outcomes=[TaskOutcome(task_id, "complete", b"late")]))

        def refused() -> bool:
            return api.metrics.worker_refusals.labels(replica="local", what="outcome")._value.get() > 0

        await _until(refused)
        await _until(lambda: dp.reports.idle)
        await asyncio.sleep(0.2)
        task = await services.tasks.get(task_id)
        assert task is not None
        assert task.status.value == "pending"

        # placed again, on a worker of its own: that worker's outcome is the one stored
        await api.worker("w2", "cpu")
        await services.scheduler.place_once()
        await api.worker("w2", "cpu")
        await services.scheduler.place_once()
        assert [d.task_id for d in await dp.take("w2")] == [task_id]
        await dp.report("w2", WorkerReport(outcomes=[TaskOutcome(task_id, "complete", b"right")]))

        result = await _stored(dp, task_id)
        assert (result.status, result.result) == ("complete", b"right")
    finally:
        await dp.close()


async def test_a_worker_reads_and_writes_payloads_of_its_own_calls_only(api: Api) -> None:
    """GetBlob and PutBlob for a task not placed on the worker answer NotFound and are counted as refused."""
    from levers9.payloads import parse_ref
    from levers9.services import fleet
    from levers9.state.errors import NotFound

    services = api.services
    dp = DataPlane(services, Hub(services.redis, name="test"), api.metrics)
    victim, _ = await api.user("team-b")
    them = Principal(token_id="t", kind=TokenKind.USER, workspace_id=victim.id, subject="someone")
    stub_id, _ = await dp.get_or_create_stub(them, {"name": "f", "cpu_millicores": 2000}, b"pickled handler")
    big = b"x" * (2 * 1024 * 1024)  # stored as a blob: the task's arguments name it
    [theirs] = await dp.submit(them, stub_id, [big])
    [task] = await dp.calls.dispatch([theirs])
    ref = parse_ref(task.args)
    assert ref is not None
    await api.worker("w1", "cpu")
    await api.worker("w2", "cpu")
    await services.scheduler.place_once()
    state = await services.scheduler.backlog.get(theirs)
    assert state is not None
    assert state.worker is not None
    owner = state.worker
    other = {"w1": "w2", "w2": "w1"}[owner]
    spec = services.pools["cpu"]
    try:
        intruder = fleet.WorkerIdentity(spec, other, 0)
        with pytest.raises(NotFound):
            async for _ in fleet.read_arguments(dp, intruder, theirs, ref[0]):
                pass

        async def one() -> AsyncIterator[bytes]:
            yield b"cos\nsystem\n(S'id'\ntR."

        with pytest.raises(NotFound):
            await fleet.store_result(dp, intruder, theirs, 21, one())
        assert api.metrics.worker_refusals.labels(replica="local", what="arguments")._value.get() == 1
        assert api.metrics.worker_refusals.labels(replica="local", what="result")._value.get() == 1
        # the worker it was placed on may
        mine = fleet.WorkerIdentity(spec, owner, 0)
        assert b"".join([p async for p in fleet.read_arguments(dp, mine, theirs, ref[0])]) == big
    finally:
        await dp.close()


async def test_a_worker_records_checkpoints_only_of_stubs_it_ran_a_call_of(api: Api) -> None:
    """A checkpoint is restored into the stub's later containers anywhere: a worker that never ran the stub
    (a forged one with the shared pool's token) may not offer one, nor change one's status or path."""
    from levers9.services import fleet
    from levers9.services.auth import PermissionDenied

    services = api.services
    dp = DataPlane(services, Hub(services.redis, name="test"), api.metrics)
    victim, _ = await api.user("team-b")
    them = Principal(token_id="t", kind=TokenKind.USER, workspace_id=victim.id, subject="someone")
    stub_id, _ = await dp.get_or_create_stub(them, {"name": "f", "cpu_millicores": 2000}, b"pickled handler")
    await api.worker("w1", "cpu")
    await api.worker("w2", "cpu")
    [task_id] = await dp.submit(them, stub_id, [b"a"])
    await services.scheduler.place_once()
    state = await services.scheduler.backlog.get(task_id)
    assert state is not None
    assert state.worker is not None
    owner, other = state.worker, {"w1": "w2", "w2": "w1"}[state.worker]
    spec = services.pools["cpu"]
    record = dict(runtime="gvisor", gpu="", status="", path="", size_bytes=0, error="")
    try:
        with pytest.raises(PermissionDenied, match="ran no call"):
            await fleet.record_checkpoint(
                dp, fleet.WorkerIdentity(spec, other, 0), checkpoint_id="", stub_id=stub_id, **record
            )
        # the worker the call is placed on may (Redis says so, before any replica sent it the call)
        made = await fleet.record_checkpoint(
            dp, fleet.WorkerIdentity(spec, owner, 0), checkpoint_id="", stub_id=stub_id, **record
        )
        assert made.stub_id == stub_id
        changed = {**record, "status": "available", "path": f"{victim.id}/{stub_id}/{made.id}"}
        with pytest.raises(PermissionDenied, match="ran no call"):
            await fleet.record_checkpoint(
                dp, fleet.WorkerIdentity(spec, other, 0), checkpoint_id=made.id, stub_id="", **changed
            )
        assert api.metrics.worker_refusals.labels(replica="local", what="checkpoint")._value.get() == 2
        # once the call is sent to it and has ended, it still may (its snapshot is published after)
        assert [d.task_id for d in await dp.take(owner)] == [task_id]
        await dp.report(owner, WorkerReport(outcomes=[TaskOutcome(task_id, "complete", b"r")]))
        await _until(lambda: dp.reports.idle)
        done = await fleet.record_checkpoint(
            dp, fleet.WorkerIdentity(spec, owner, 0), checkpoint_id=made.id, stub_id="", **changed
        )
        assert done.status.value == "available"
    finally:
        await dp.close()


async def test_a_late_start_from_a_worker_presumed_dead_is_refused_on_the_placement_in_redis(api: Api) -> None:
    """The worker the call was sent to from here was presumed dead and the call queued again. Its late report that
    the call started is refused on Redis's word, though this replica remembers sending it there and SQL has it
    pending on no worker: stored, the call would show running on a dead worker, and its next worker's start
    would not be stored (nor, while the history of its new placement is not written, its outcome)."""
    services = api.services
    dp = DataPlane(services, Hub(services.redis, name="test"), api.metrics)
    workspace, _ = await api.user("team-a")
    me = Principal(token_id="t", kind=TokenKind.USER, workspace_id=workspace.id, subject="someone")
    stub_id, _ = await dp.get_or_create_stub(me, {"name": "f", "cpu_millicores": 2000}, b"pickled handler")
    await api.worker("w1", "cpu")
    [task_id] = await dp.submit(me, stub_id, [b"a"])
    await services.scheduler.place_once()
    try:
        assert [d.task_id for d in await dp.take("w1")] == [task_id]
        assert await services.scheduler.remove_worker("w1", "was silent", force=True) == [task_id]
        state = await services.scheduler.backlog.get(task_id)
        assert state is not None
        assert (state.state, state.worker) == ("queued", None)

        # this replica still remembers sending it to w1, so the report gets past that check; SQL has the task
        # pending on no worker, as a start that is only late has it
        await dp.report("w1", WorkerReport(started=[(task_id, "ctr-late")]))

        def refused() -> bool:
            return api.metrics.worker_refusals.labels(replica="local", what="start")._value.get() > 0

        await _until(refused)
        await _until(lambda: dp.reports.idle)
        task = await services.tasks.get(task_id)
        assert task is not None
        assert (task.status.value, task.container_id) == ("pending", None)

        await api.worker("w2", "cpu")
        await services.scheduler.place_once()
        assert [d.task_id for d in await dp.take("w2")] == [task_id]
        await dp.report("w2", WorkerReport(started=[(task_id, "ctr-2")]))
        await dp.report("w2", WorkerReport(outcomes=[TaskOutcome(task_id, "complete", b"right")]))
        result = await _stored(dp, task_id)
        assert (result.status, result.result) == ("complete", b"right")
        task = await services.tasks.get(task_id)
        assert task is not None
        assert (task.worker_id, task.container_id) == ("w2", "ctr-2")
    finally:
        await dp.close()
