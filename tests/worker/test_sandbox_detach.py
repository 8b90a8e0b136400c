"""Detaching a sandbox's runner and attaching again (what a snapshot does), in this process over socketpairs.

The runner (:class:`levers9.runner.sandbox.SandboxRunner` on a :class:`~levers9.runner.sandbox.Relay`)
serves one connection, is detached, and serves a second; the worker's side is one
:class:`~levers9.worker.warm.sandbox_client.SandboxSession` per connection. What is checked: the processes
run on while nobody is attached, their output meanwhile is held and arrives after ``attach``, in order,
with nothing lost or repeated; a process that ended while detached is listed ended and its output is
complete; a session that never knew the processes adopts them; a runner without a relay refuses to detach.
Real processes of this machine; every process group is gone at the end.
"""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
from collections.abc import AsyncIterator
from typing import BinaryIO

import pytest

from levers9.runner.main import Channel
from levers9.runner.sandbox import Relay, SandboxRunner
from levers9.worker.warm.sandbox_client import SandboxError, SandboxProcess, SandboxSession
from tests.worker.test_sandbox_runner import _group_alive

COUNTER = "import time\nfor i in range(60):\n    print(i, flush=True)\n    time.sleep(0.05)\n"
SHORT = "import time\ntime.sleep(0.3)\nprint('done while detached', flush=True)\n"


class Runner:
    """A runner on a relay, served one connection at a time on a thread."""

    def __init__(self) -> None:
        self.relay = Relay()
        self.runner = SandboxRunner(self.relay)
        self.thread: threading.Thread | None = None

    async def connect(self, *, first: bool) -> SandboxSession:
        ours, theirs = socket.socketpair()
        self.relay.connect(Channel(theirs))
        if first:
            self.relay.flow()
        stream = theirs.makefile("rb")
        self.thread = threading.Thread(target=self._serve, args=(stream, theirs), daemon=True)
        self.thread.start()
        reader, writer = await asyncio.open_connection(sock=ours)
        return SandboxSession(reader, writer, name="detach-test").start()

    def _serve(self, stream: BinaryIO, sock: socket.socket) -> None:
        try:
            self.runner.serve(stream)
        finally:
            stream.close()
            sock.close()

    async def served(self) -> None:
        assert self.thread is not None
        await asyncio.to_thread(self.thread.join, 10)
        assert not self.thread.is_alive(), "the runner did not stop serving"


@pytest.fixture
async def runner() -> AsyncIterator[Runner]:
    made = Runner()
    yield made
    made.runner.close()
    groups = [p.popen.pid for p in made.runner._processes.values()]
    for _ in range(100):
        left = [g for g in groups if _group_alive(g)]
        if not left:
            break
        await asyncio.sleep(0.05)
    assert not left, f"process groups left running: {left}"


async def _lines(process: SandboxProcess, count: int, it: AsyncIterator[object] | None = None) -> list[bytes]:
    it = it or process.output().__aiter__()
    got = []
    for _ in range(count):
        chunk = await asyncio.wait_for(anext(it), 10)
        got.append(chunk.data)  # type: ignore[attr-defined]
    return got


async def test_processes_run_on_while_detached_and_their_output_follows_the_attach(runner: Runner) -> None:
    first = await runner.connect(first=True)
    counter = await first.exec(sys.executable, "-c", COUNTER)
    short = await first.run_code(SHORT)
    reading = counter.output().__aiter__()
    before = await _lines(counter, 5, reading)

    carry = await first.detach()
    await runner.served()
    assert runner.runner.detached
    assert set(carry) == {counter.id, short.id}
    assert first.gone is not None
    assert counter.running  # the session ended, its processes did not
    await asyncio.sleep(0.8)  # the short one ends meanwhile, the counter goes on printing into a held relay

    second = await runner.connect(first=False)
    adopted = await second.attach(carry)
    assert [p.id for p in adopted] == [counter.id, short.id]
    assert adopted[0] is counter  # the same objects, with what they had buffered
    assert counter.session is second

    # the short one ended while nobody was attached: its output and end arrive all the same
    assert await asyncio.wait_for(short.read_all(), 10) == (b"done while detached\n", b"")
    assert await short.wait() == 0
    # the counter's lines go on where they stopped: none lost, none repeated
    rest = [chunk.data async for chunk in reading]
    assert before + rest == [f"{i}\n".encode() for i in range(60)]
    assert await counter.wait() == 0
    listed = {p.process: p for p in await second.list_processes()}
    assert not listed[counter.id].running
    await second.close()
    await runner.served()
    assert not runner.runner.detached


async def test_a_new_session_adopts_the_processes_it_never_started(runner: Runner) -> None:
    first = await runner.connect(first=True)
    sleeper = await first.exec("sleep", "30")
    await first.detach()
    await runner.served()

    second = await runner.connect(first=False)
    adopted = await second.attach()
    assert [(p.id, p.pid, p.argv, p.running) for p in adopted] == [(sleeper.id, sleeper.pid, ["sleep", "30"], True)]
    assert await adopted[0].kill() is True
    assert await asyncio.wait_for(adopted[0].wait(), 10) == -9
    await second.close()
    await runner.served()


async def test_a_runner_without_a_relay_refuses_to_detach_and_goes_on() -> None:
    ours, theirs = socket.socketpair()
    runner = SandboxRunner(Channel(theirs))
    stream = theirs.makefile("rb")
    thread = threading.Thread(target=runner.serve, args=(stream,), daemon=True)
    thread.start()
    reader, writer = await asyncio.open_connection(sock=ours)
    session = SandboxSession(reader, writer, name="no-relay").start()
    try:
        with pytest.raises(SandboxError) as refused:
            await session.detach()
        assert refused.value.code == "Unsupported"
        assert "signal directory" in str(refused.value)
        process = await session.exec("echo", "still here")
        assert await process.read_all() == (b"still here\n", b"")
    finally:
        await session.close()
        await asyncio.to_thread(thread.join, 10)
        theirs.close()
    assert not thread.is_alive()
