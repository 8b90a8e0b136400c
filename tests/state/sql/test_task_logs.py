"""Output kept per task: the first ``max_task_log_bytes``, then one marker row saying how much was dropped."""

from __future__ import annotations

import re

from levers9.state.sql.calls import CallStore
from levers9.state.sql.database import Database
from levers9.state.sql.records import WorkspaceRecord
from levers9.state.sql.tasks import TaskStore

CAP = 64 * 1024
MARKER = re.compile(
    rb"\n?\[levers9: ([0-9,]+) bytes of output dropped; the limit is 64 KiB \(limits\.max_task_log_bytes\)\]\n"
)


async def _output(calls: CallStore, task_id: str) -> bytes:
    return b"".join(data for _, data in await calls.logs(task_id, limit=100_000))


def _dropped(output: bytes) -> tuple[bytes, int]:
    """The kept output and the count its marker shows; fails when there is no marker at the end."""
    match = MARKER.search(output)
    assert match is not None, output[-300:]
    assert match.end() == len(output), output[-300:]
    return output[: match.start()], int(match[1].replace(b",", b""))


async def test_output_past_the_cap_is_dropped_and_counted(db: Database, workspace: WorkspaceRecord) -> None:
    tasks = TaskStore(db)
    big, small = await tasks.create(workspace.id, {}), await tasks.create(workspace.id, {})
    calls = CallStore(db, max_task_log_bytes=CAP)
    line = b"x" * 99 + b"\n"
    for _ in range(20):  # 20 batches of 100 lines: 200,000 bytes in all
        await calls.append_logs([(big.id, line)] * 100 + [(small.id, b"fine\n")])
    kept, dropped = _dropped(await _output(calls, big.id))
    assert kept == line * (CAP // len(line)) + line[: CAP % len(line)]
    assert dropped == 200_000 - CAP
    assert await _output(calls, small.id) == b"fine\n" * 20  # another task is not affected
    output = await _output(calls, big.id)
    assert len(output) <= CAP + 100
    assert output.endswith(
        f"[levers9: {200_000 - CAP:,} bytes of output dropped; the limit is 64 KiB ".encode()
        + b"(limits.max_task_log_bytes)]\n"
    )


async def test_a_replica_that_did_not_see_the_task_continues_the_count(
    db: Database, workspace: WorkspaceRecord
) -> None:
    task = await TaskStore(db).create(workspace.id, {})
    await CallStore(db, max_task_log_bytes=CAP).append_logs([(task.id, b"a" * (CAP + 10))])
    later = CallStore(db, max_task_log_bytes=CAP)  # a restart, or another replica: nothing in memory
    await later.append_logs([(task.id, b"b" * 5)])
    await later.append_logs([(task.id, b"c" * 5)])
    kept, dropped = _dropped(await _output(later, task.id))
    assert (kept, dropped) == (b"a" * CAP, 20)
    rows = await later.logs(task.id)
    assert len(rows) == 2  # the kept part and one marker, updated in place


async def test_the_cut_does_not_split_a_character(db: Database, workspace: WorkspaceRecord) -> None:
    task = await TaskStore(db).create(workspace.id, {})
    calls = CallStore(db, max_task_log_bytes=CAP)
    await calls.append_logs([(task.id, b"a" * (CAP - 1) + "é".encode() + b"tail")])
    output = await _output(calls, task.id)
    kept, dropped = _dropped(output)
    assert kept == b"a" * (CAP - 1)
    assert dropped == 2 + 4
    assert output.decode()  # whole characters only
    assert output[CAP - 1 : CAP] == b"\n"  # the marker starts its own line


async def test_output_that_fits_is_stored_whole(db: Database, workspace: WorkspaceRecord) -> None:
    task = await TaskStore(db).create(workspace.id, {})
    calls = CallStore(db, max_task_log_bytes=CAP)
    await calls.append_logs([(task.id, b"z" * (CAP - 1)), (task.id, b"\n")])
    assert await _output(calls, task.id) == b"z" * (CAP - 1) + b"\n"
