"""Tasks as their owners see them: listing, one task, its placement history, its output, cancelling it.

Every function takes the caller's :class:`~levers9.services.auth.Principal`
and acts only on that workspace's tasks (see :mod:`levers9.services.access`).
Cancelling is one operation whatever the transport: REST's
``POST /tasks/ID/cancel``, gRPC's CancelTask and the SDK's ``cancel()`` all
end in :func:`cancel_task`, which tells the task's worker to stop it and wakes
everyone watching it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from levers9.payloads import JSON_CALL
from levers9.services.access import own_workspace, owned_task
from levers9.services.auth import Principal
from levers9.services.dataplane import DataPlane
from levers9.state.errors import NotFound
from levers9.state.sql.records import PlacementEvent, TaskRecord

__all__ = [
    "MAX_TASKS_LISTED",
    "DeploymentTask",
    "cancel_task",
    "deployment_task",
    "function_names",
    "get_task",
    "list_tasks",
    "task_history",
    "task_logs",
]

#: the most tasks one listing answers
MAX_TASKS_LISTED = 10_000
#: seconds between two looks for new output of a task being followed
_FOLLOW_EVERY_S = 0.25


async def list_tasks(
    dp: DataPlane, principal: Principal, *, statuses: Sequence[str] | None = None, limit: int = 100
) -> list[TaskRecord]:
    """The caller's workspace's tasks, newest first; ``limit`` is held to 1..:data:`MAX_TASKS_LISTED`."""
    workspace = own_workspace(principal, "list tasks")
    return await dp.services.tasks.for_workspace(
        workspace, statuses=None if statuses is None else list(statuses), limit=min(max(limit, 1), MAX_TASKS_LISTED)
    )


async def get_task(dp: DataPlane, principal: Principal, task_id: str) -> TaskRecord:
    """One of the caller's tasks; NotFound for a missing one and for another workspace's alike."""
    return await owned_task(dp.services, principal, task_id)


async def task_history(dp: DataPlane, principal: Principal, task_id: str) -> list[PlacementEvent]:
    """Where the scheduler tried to place the task, and how each attempt went."""
    await owned_task(dp.services, principal, task_id)
    return await dp.services.tasks.history(task_id)


async def function_names(dp: DataPlane, records: Sequence[TaskRecord]) -> dict[str, str]:
    """The function name of each stub the tasks ran (by stub id; a stub gone since is left out)."""
    names: dict[str, str] = {}
    for stub_id in {r.stub_id for r in records if r.stub_id}:
        try:
            record, _ = await dp.stub(stub_id)
        except NotFound:
            continue
        names[stub_id] = record.name
    return names


async def cancel_task(dp: DataPlane, principal: Principal, task_id: str) -> tuple[bool, TaskRecord]:
    """Stop one of the caller's tasks; (whether it was still unfinished, the task as it is now).

    Its worker is told to end it (its process and what that started) and its watchers wake with
    ``cancelled``. A task that had already finished keeps its status and answers False: not an error.
    """
    cancelled = await dp.cancel(principal, task_id)
    task = await dp.services.tasks.get(task_id)
    if task is None:
        raise NotFound("task", task_id)
    return cancelled, task


async def task_logs(dp: DataPlane, principal: Principal, task_id: str, *, follow: bool) -> AsyncIterator[bytes]:
    """The task's output in order; with ``follow``, what it writes next too, until it finishes."""
    await owned_task(dp.services, principal, task_id)
    after = 0
    while True:
        chunks = await dp.calls.logs(task_id, after=after)
        for chunk_id, data in chunks:
            after = chunk_id
            yield data
        if chunks:
            continue
        if not follow:
            return
        record = await dp.services.tasks.get(task_id)
        if record is None or record.status.terminal:
            # one more read: output written just before the task finished
            for chunk_id, data in await dp.calls.logs(task_id, after=after):
                after = chunk_id
                yield data
            return
        await asyncio.sleep(_FOLLOW_EVERY_S)


@dataclass(frozen=True)
class DeploymentTask:
    """A queue item or job run as the gateway answers it: its status, and once finished its result or error."""

    task_id: str
    status: str
    attempts: int
    #: the JSON result of a finished call that returned JSON (``has_result`` tells None from no result)
    result: Any = None
    has_result: bool = False
    error_type: str | None = None
    error: str | None = None


async def deployment_task(dp: DataPlane, workspace_id: str, stub_id: str, task_id: str) -> DeploymentTask | None:
    """A task of the deployed stub ``stub_id``; None when there is none by that id in this deployment."""
    task = await dp.services.tasks.get(task_id)
    if task is None or task.workspace_id != workspace_id or task.stub_id != stub_id:
        return None
    results = await dp.calls.results([task_id], workspace_id=workspace_id)
    if not results:
        return DeploymentTask(task_id, str(task.status), task.attempts)
    done = results[0]
    payload = await dp.payload(workspace_id, done.result) if done.result else None
    has_result = payload is not None and payload.startswith(JSON_CALL)
    result = json.loads(payload[len(JSON_CALL) :]) if has_result and payload is not None else None
    error_type = (done.error_type or "Error") if done.error else None
    return DeploymentTask(task_id, done.status, task.attempts, result, has_result, error_type, done.error)
