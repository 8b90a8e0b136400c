"""The worker's outbox: what it sends up its session, in messages no channel refuses, and never a cancelled result."""

from __future__ import annotations

import asyncio

from levers9.payloads import BATCH_BYTES, INLINE_MAX_BYTES
from levers9.proto.v1 import common_pb2, worker_pb2
from levers9.worker.outbox import Outbox


async def _drain(outbox: Outbox) -> list[worker_pb2.WorkerMessage]:
    stop = asyncio.Event()
    sent: list[worker_pb2.WorkerMessage] = []

    async def collect() -> None:
        async for message in outbox.messages(keepalive_s=60, stop=stop):
            sent.append(message)
            if not outbox.results and not outbox.logs:
                stop.set()
                outbox.wake.set()

    await asyncio.wait_for(collect(), 30)
    return sent


def test_results_and_output_go_in_messages_cut_at_the_batch_budget() -> None:
    async def main() -> list[worker_pb2.WorkerMessage]:
        outbox = Outbox()
        for i in range(60):  # 60 MiB of results and 60 MiB of output at once: one message would be refused
            outbox.result(common_pb2.TaskResult(task_id=f"t{i}", status="complete", result=b"r" * INLINE_MAX_BYTES))
            outbox.log(f"t{i}", b"o" * INLINE_MAX_BYTES)
        return await _drain(outbox)

    sent = asyncio.run(main())
    assert sum(len(m.results) for m in sent) == 60
    assert sum(len(m.logs) for m in sent) == 60
    assert len(sent) >= 4
    for message in sent:
        assert sum(len(r.result) for r in message.results) <= BATCH_BYTES
        assert sum(len(log.data) for log in message.logs) <= BATCH_BYTES


def test_a_cancelled_tasks_result_is_neither_sent_nor_resent() -> None:
    async def main() -> tuple[list[str], list[str]]:
        outbox = Outbox()
        outbox.result(common_pb2.TaskResult(task_id="keep", status="complete", result=b"1"))
        outbox.result(common_pb2.TaskResult(task_id="gone", status="complete", result=b"2"))
        outbox.drop("gone")
        first = [r.task_id for m in await _drain(outbox) for r in m.results]
        outbox.resend_recent()  # as after a reconnect
        again = [r.task_id for m in await _drain(outbox) for r in m.results]
        return first, again

    first, again = asyncio.run(main())
    assert first == ["keep"]
    assert again == ["keep"]
