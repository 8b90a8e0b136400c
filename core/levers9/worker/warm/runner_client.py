"""The worker's side of the runner protocol: connecting to a container's runner, and one call or serve over it.

The runner (:mod:`levers9.runner.main`) runs untrusted code, so this side
trusts nothing it sends: results and exceptions are passed on as the bytes the
runner produced, never unpickled here, and every frame is read with a size
limit (see :mod:`levers9.runner.frames`). A connection is proved with the
container's token (the ``hello`` frame) before any call is sent.

A runner is reached at ``host:port``: the container's own address on the
worker's bridge and the runner's port (or the address the runtime reports for a
forwarded port, on the host's network), or, for a checkpointed container, at
the unix socket in its signal directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
from pathlib import Path

from levers9.backoff import Backoff
from levers9.checkpoint.snapshot import SIGNAL_SOCKET
from levers9.hooks.errors import Levers9Error
from levers9.hooks.types import ContainerStatus
from levers9.runner import frames
from levers9.worker.calls import Call, Outcome, RemoteErrorInfo, Serving, cancelled_outcome, error_outcome
from levers9.worker.warm.launch import EXIT_WAIT_S, Launcher, StartFailed
from levers9.worker.warm.scaling import QueuedCall, WarmContainer, WarmStub

__all__ = ["RunnerClient", "handshake"]

log = logging.getLogger(__name__)

Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class RunnerClient:
    """Talks to the runners of one pool's containers; ``launcher`` signals and inspects the containers."""

    def __init__(self, launcher: Launcher, *, max_result_bytes: int, start_timeout_s: float) -> None:
        self.launcher = launcher
        self.max_result_bytes = max_result_bytes
        self.start_timeout_s = start_timeout_s

    async def connect(self, box: WarmContainer) -> Streams:
        """Connect to the runner and authenticate, retrying while it starts, until it answers or the container ends.

        Raises :class:`StartFailed` with the container's output when it does not answer.
        """
        try:
            return await self._connect(box)
        except Levers9Error as exc:
            raise StartFailed(f"the runtime could not start the container: {exc}") from exc

    async def _connect(self, box: WarmContainer) -> Streams:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.start_timeout_s
        polling = Backoff(initial_s=0.005, cap_s=0.05)  # a runner is up in tens of milliseconds
        while True:
            if box.stop_requested:
                raise StartFailed("the container was stopped while it started")
            state = await self.launcher.state(box.cid)
            if state.status in (ContainerStatus.EXITED, ContainerStatus.UNKNOWN):
                code = "" if state.exit_code is None else f" with code {state.exit_code}"
                raise StartFailed(
                    f"container {box.cid} exited{code} before its runner answered; "
                    f"its output:\n{await self.launcher.log_tail(box.cid)}"
                )
            address = state.address or (f"{state.ip}:{box.port}" if state.ip else None)
            if box.signal_dir is not None:
                sock = box.signal_dir / SIGNAL_SOCKET
                address = f"unix:{sock}" if sock.exists() else None
            if address is not None:
                with contextlib.suppress(OSError, asyncio.IncompleteReadError, frames.ProtocolError, TimeoutError):
                    remaining = max(0.1, deadline - loop.time())
                    return await asyncio.wait_for(handshake(address, box.token), min(remaining, 10.0))
            if loop.time() > deadline:
                raise StartFailed(
                    f"the runner in container {box.cid} did not answer within {self.start_timeout_s:g} s; "
                    f"its output:\n{await self.launcher.log_tail(box.cid)}"
                )
            await asyncio.sleep(polling.next_s())

    # ----------------------------------------------------------------- one call

    async def execute(self, group: WarmStub, box: WarmContainer, pending: QueuedCall) -> tuple[Outcome, bool]:
        """Run the call in ``box``: its outcome, and whether the container can take another call."""
        call = pending.call
        assert box.reader is not None
        assert box.writer is not None
        try:
            await frames.write_frame(
                box.writer, "call", call.args, task_id=call.task_id, max_result=self.max_result_bytes
            )
        except (OSError, ConnectionError):
            return await self.exit_outcome(group, box, call), False
        await notify_started(pending, box.cid)
        reading = asyncio.ensure_future(self._read_result(box.reader, pending))
        stopping = asyncio.ensure_future(pending.stop.wait())
        try:
            done, _ = await asyncio.wait(
                {reading, stopping}, timeout=call.timeout_s or None, return_when=asyncio.FIRST_COMPLETED
            )
        except asyncio.CancelledError:
            reading.cancel()  # the worker is stopping this call: nothing is left pending behind it
            raise
        finally:
            stopping.cancel()
        if reading in done:
            try:
                return reading.result(), True
            except (OSError, asyncio.IncompleteReadError):
                return await self.exit_outcome(group, box, call), False
            except frames.ProtocolError as exc:
                await self.launcher.kill(box)
                return error_outcome(call, "ProtocolError", f"the container's runner broke the protocol: {exc}"), False
        reading.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await reading
        await self.launcher.kill(box)
        if pending.stop.is_set():
            return cancelled_outcome(call, pending.stop_reason), False
        message = f"the call exceeded its timeout of {call.timeout_s:g} s"
        return error_outcome(call, "TimeoutError", message, "timeout"), False

    async def execute_serving(self, group: WarmStub, box: WarmContainer, pending: QueuedCall) -> Outcome:
        """Have ``box`` serve (see the runner's ``serve``) until the call is stopped or the container ends."""
        call, stub = pending.call, group.spec
        assert box.reader is not None
        assert box.writer is not None
        interface = "box" if stub.kind == "box" else stub.interface
        try:
            await frames.write_frame(
                box.writer,
                "serve",
                task_id=call.task_id,
                interface=interface,
                port=box.http_port,
                concurrency=stub.tasks_per_container,
                ports=list(stub.ports),
            )
        except (OSError, ConnectionError):
            return await self.exit_outcome(group, box, call)
        ready = asyncio.Event()
        reading = asyncio.ensure_future(self._follow_serving(group, box, pending, ready))
        stopping = asyncio.ensure_future(pending.stop.wait())
        readying = asyncio.ensure_future(ready.wait())
        try:
            done, _ = await asyncio.wait(
                {reading, stopping, readying}, timeout=self.start_timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
            if readying in done and reading not in done and stopping not in done:
                done, _ = await asyncio.wait({reading, stopping}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            reading.cancel()
            raise
        finally:
            stopping.cancel()
            readying.cancel()
        if reading in done:
            try:
                return reading.result()
            except (OSError, asyncio.IncompleteReadError):
                return await self.exit_outcome(group, box, call)
            except frames.ProtocolError as exc:
                await self.launcher.kill(box)
                return error_outcome(call, "ProtocolError", f"the container's runner broke the protocol: {exc}")
        reading.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await reading
        await self.launcher.kill(box)
        if pending.stop.is_set():
            return cancelled_outcome(call, pending.stop_reason)
        what = "its ports did not accept connections" if stub.kind == "box" else "its HTTP server did not start"
        return error_outcome(call, "StartTimeout", f"{what} within {self.start_timeout_s:g} s", "timeout")

    async def _follow_serving(
        self, group: WarmStub, box: WarmContainer, pending: QueuedCall, ready: asyncio.Event
    ) -> Outcome:
        """Pass on the serving container's output; say where it serves once it does; its result, if it ends."""
        assert box.reader is not None
        task_id = pending.call.task_id
        on_host = self.launcher.capabilities.host_network
        while True:
            frame = await frames.read_frame(box.reader, max_payload=self.max_result_bytes)
            if frame.kind == "log":
                deliver_log(pending, frame.payload)
            elif frame.kind == "serving" and not ready.is_set():
                state = await self.launcher.state(box.cid)
                if not on_host and not state.ip:
                    await self.launcher.kill(box)
                    return error_outcome(
                        pending.call,
                        "NoAddress",
                        f"the {self.launcher.runtime.name} runtime "
                        "reports no address for the container, so the gateway could not reach it",
                    )
                host = "127.0.0.1" if on_host else str(state.ip)
                serving = Serving(
                    container_id=box.cid,
                    address=f"{host}:{box.http_port}" if group.spec.kind != "box" else "",
                    ports={p: f"{host}:{p}" for p in group.spec.ports},
                )
                ready.set()
                await notify_started(pending, box.cid)
                if pending.on_serving is not None:
                    try:
                        result = pending.on_serving(serving)
                        if inspect.isawaitable(result):
                            await result
                    except Exception:
                        log.exception("on_serving of task %s failed", task_id)
            elif frame.kind == "result" and frame.text("task_id") == task_id:
                return _result_outcome(task_id, frame)
            else:
                raise frames.ProtocolError(f"unexpected {frame.kind!r} frame from a serving container")

    async def _read_result(self, reader: asyncio.StreamReader, pending: QueuedCall) -> Outcome:
        task_id = pending.call.task_id
        while True:
            frame = await frames.read_frame(reader, max_payload=self.max_result_bytes)
            if frame.kind == "log":
                deliver_log(pending, frame.payload)
                continue
            if frame.kind != "result" or frame.text("task_id") != task_id:
                raise frames.ProtocolError(f"expected the result of {task_id}, got a {frame.kind!r} frame")
            return _result_outcome(task_id, frame)

    async def exit_outcome(self, group: WarmStub, box: WarmContainer, call: Call) -> Outcome:
        """The outcome of a call whose container went away under it: how it ended, and its last output."""
        state = await self.launcher.wait_exited(box.cid, EXIT_WAIT_S)
        if state is None:  # the connection broke but the container lives on: no use to anyone
            await self.launcher.kill(box)
            state = await self.launcher.state(box.cid)
        code = "unknown" if state.exit_code is None else str(state.exit_code)
        tail = await self.launcher.log_tail(box.cid)
        if state.oom_killed:
            kind = "OutOfMemory"
            message = f"the container ran out of memory ({group.spec.memory_mib} MiB) and was killed (exit code {code})"
        else:
            kind = "ContainerExited"
            message = f"the container exited with code {code} while running the call"
        return error_outcome(call, kind, f"{message}; its last output:\n{tail}" if tail else message)


def _result_outcome(task_id: str, frame: frames.Frame) -> Outcome:
    status = frame.text("status")
    if status == "complete":
        return Outcome(task_id=task_id, status="complete", result=frame.payload)
    if status != "error":
        raise frames.ProtocolError(f"unknown result status {status!r}")
    error = frames.Frame("error", frame.object("error"))
    info = RemoteErrorInfo(
        type=error.text("type"), message=error.text("message", ""), traceback=error.text("traceback", "")
    )
    return Outcome(task_id=task_id, status="error", result=frame.payload, error=info)


async def handshake(address: str, token: str) -> Streams:
    """Connect to a runner at ``host:port`` or ``unix:PATH`` and prove the container's token."""
    if address.startswith("unix:"):
        path = Path(address.removeprefix("unix:"))
        # a socket path may hold at most 107 bytes, and a worker's state directory can be deep: the
        # directory is reached through a descriptor of it instead
        directory = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
        try:
            reader, writer = await asyncio.open_unix_connection(f"/proc/self/fd/{directory}/{path.name}")
        finally:
            os.close(directory)
    else:
        host, _, port = address.rpartition(":")
        reader, writer = await asyncio.open_connection(host, int(port))
    try:
        await frames.write_frame(writer, "hello", token=token)
        answer = await frames.read_frame(reader, max_payload=0)
        if answer.kind != "ready":
            raise frames.ProtocolError(f"the runner answered hello with {answer.kind!r}")
    except BaseException:
        writer.close()
        raise
    return reader, writer


async def notify_started(pending: QueuedCall, cid: str) -> None:
    if pending.on_started is None:
        return
    try:
        result = pending.on_started(cid)
        if inspect.isawaitable(result):
            await result
    except Exception:
        log.exception("on_started of task %s failed", pending.call.task_id)


def deliver_log(pending: QueuedCall, data: bytes) -> None:
    if pending.on_log is None:
        return
    try:
        pending.on_log(pending.call.task_id, data)
    except Exception:
        log.exception("on_log of task %s failed", pending.call.task_id)
