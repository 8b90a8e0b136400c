"""Processes in a sandbox: ``sb.process.exec(...)``, ``run_code``, ``list_processes``, and each process's handle.

A process has two numbers: ``pid``, its id inside the sandbox (what the user sees, and what
``list_processes`` and ``get_process`` key by), and the sandbox's own number for it, which names it in the
REST paths (``/sandboxes/{id}/processes/{process}``). One :class:`SandboxProcess` object stands for one
process per sandbox object (the manager keeps them), because the process's output is handed out once, to
one reader: a process this manager started is read from the moment it starts (so a chatty process is never
held up by a full output window while nobody iterates), one found by ``list_processes`` from the first use
of its output or ``wait``. If another program is reading it already (409 OutputBusy), ``wait`` and
``status`` still work (the exit code is polled) and its streams raise that error.

``exec`` and ``run_code`` start a process with one request that waits (``POST .../processes?wait=true``):
its answer's first line is the process, returned as soon as it comes, and the rest, its output to its exit
line, is read in the background as the output route's would be. A controlplane that answers the plain start
(JSON, no ``wait``) is read as before: the output apart, with the output route.

``wait`` waits for the process's end on its output stream (no polling), ``wait(timeout)`` raises
:class:`~levers9.sdk.sandbox_errors.ProcessTimeout` with the process still running, and a sandbox that
ends under the process raises :class:`~levers9.sdk.sandbox_errors.SandboxEnded` (or ``SandboxGone``)
naming it. ``.aio`` on the manager and on a process gives the same operations as coroutines.
"""

from __future__ import annotations

import asyncio
import json
import signal as signals
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import httpx

from levers9.sdk.sandbox_errors import ProcessTimeout, SandboxError, SandboxProcessError, SandboxRequestError
from levers9.sdk.sandbox_http import REQUEST_TIMEOUT_S, SandboxRef
from levers9.sdk.sandbox_output import BOTH, ProcessOutput, SandboxProcessStream, read_output

__all__ = [
    "AsyncSandboxProcess",
    "AsyncSandboxProcessManager",
    "SandboxProcess",
    "SandboxProcessManager",
    "SandboxProcessResponse",
]

#: how often ``wait`` asks for a process's state when its output is read by another program
BUSY_POLL_S = 0.25


class SandboxProcessResponse:
    """A finished ``run_code``: its ``pid``, ``exit_code``, ``stdout``, ``stderr`` and ``result`` (both, in that order)."""

    def __init__(self, pid: int, exit_code: int, stdout: str, stderr: str) -> None:
        self.pid = pid
        self.exit_code = exit_code
        self.stdout = stdout
        self.stderr = stderr
        self.result = stdout + stderr

    def __repr__(self) -> str:
        return f"<SandboxProcessResponse pid={self.pid} exit_code={self.exit_code}>"


class SandboxProcess:
    """One process in a sandbox: its output streamed line by line, ``wait``, ``kill``, ``status``."""

    def __init__(self, sandbox: SandboxRef, info: Mapping[str, Any]) -> None:
        self._sandbox = sandbox
        #: the sandbox's own number for the process (the REST paths name it)
        self.process = int(info["process"])
        #: the process's id inside the sandbox
        self.pid = int(info.get("pid") or 0)
        self.args: list[str] = list(info.get("argv") or [])
        self.cwd: str | None = info.get("cwd")
        self._output = ProcessOutput()
        self._started = False
        self._views: dict[str, SandboxProcessStream] = {}

    def __repr__(self) -> str:
        return f"<SandboxProcess pid={self.pid} in {self._sandbox.id}>"

    @property
    def _what(self) -> str:
        return f"process {self.pid} in sandbox {self._sandbox.id}"

    def _path(self, tail: str = "") -> str:
        return f"/processes/{self.process}{tail}"

    # ------------------------------------------------------------------ output

    def _read(self) -> None:
        """Start the one background reader of this process's output, once."""
        if self._started:
            return
        self._started = True
        self._sandbox.http.spawn(self._reader())

    async def _reader(self) -> None:
        sandbox = self._sandbox

        @asynccontextmanager
        async def lines() -> AsyncIterator[AsyncIterator[str]]:
            async with sandbox.http.stream(
                "GET",
                sandbox.path(self._path("/output")),
                what=f"output of {self._what}",
                read_timeout=None,
                sandbox_id=sandbox.id,
            ) as response:
                yield response.aiter_lines()

        await read_output(
            lines,
            self._output,
            what=f"output of {self._what}",
            sandbox_id=sandbox.id,
            on_busy=self._busy,
            on_break=sandbox.explain,
        )

    async def _busy(self, _: SandboxError) -> int | None:
        """The exit code, polled: another program reads the output."""
        while True:
            code, state = await self._status()
            if state != "running":
                return code
            await asyncio.sleep(BUSY_POLL_S)

    async def _read_rest(self, lines: AsyncIterator[str]) -> None:
        """Read the output from ``lines``, the rest of the exec's own answer (one that waits), to its end."""
        sandbox = self._sandbox
        self._started = True
        what = f"output of {self._what}"

        @asynccontextmanager
        async def rest() -> AsyncIterator[AsyncIterator[str]]:
            try:
                yield lines
            except httpx.HTTPError as exc:
                raise sandbox.http.unreachable(what, exc, None) from None

        await read_output(
            rest, self._output, what=what, sandbox_id=sandbox.id, on_busy=self._busy, on_break=sandbox.explain
        )

    def _view(self, name: str) -> SandboxProcessStream:
        view = self._views.get(name)
        if view is None:
            view = self._views[name] = SandboxProcessStream(self._output, name, self._read)
        return view

    @property
    def stdout(self) -> SandboxProcessStream:
        """The process's standard output, line by line as it comes (``for line in p.stdout``, ``p.stdout.read()``)."""
        return self._view("stdout")

    @property
    def stderr(self) -> SandboxProcessStream:
        """The process's standard error, line by line as it comes."""
        return self._view("stderr")

    @property
    def logs(self) -> SandboxProcessStream:
        """Both streams' lines, in the order they came."""
        return self._view(BOTH)

    def output(self, idle_timeout: float | None = None) -> Iterator[tuple[str, str]]:
        """(stream, line) for each line of both streams in the order they came, from the first, as they come.

        It ends when the process does (raising the sandbox's error if it went first), or once nothing came
        for ``idle_timeout`` seconds (None: wait as long as the process runs). Independent of the
        ``stdout``, ``stderr`` and ``logs`` streams' places.
        """
        self._read()
        index = 0
        while True:
            found, done = self._output.tagged(index)
            if found is not None:
                index += 1
                yield found
                continue
            if done:
                if self._output.error is not None:
                    raise self._output.error
                return
            if not self._output.wait_sync(BOTH, index, idle_timeout):
                return

    # ------------------------------------------------------------------ control

    def _ended(self) -> int:
        output = self._output
        if output.exit_code is not None:
            return output.exit_code
        assert output.error is not None
        raise output.error

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the process to end and return its exit code (minus the signal that ended it, if one did)."""
        self._read()
        if not self._output.wait_done_sync(timeout):
            raise ProcessTimeout(f"{self._what} is still running after {timeout:g} s", sandbox_id=self._sandbox.id)
        return self._ended()

    async def _wait(self, timeout: float | None = None) -> int:
        self._read()
        try:
            await asyncio.wait_for(self._output.wait_done_async(), timeout)
        except TimeoutError:
            assert timeout is not None
            raise ProcessTimeout(
                f"{self._what} is still running after {timeout:g} s", sandbox_id=self._sandbox.id
            ) from None
        return self._ended()

    async def _kill(self, signal: int) -> bool:
        answer = await self._sandbox.request(
            "POST", self._path("/kill"), what=f"kill {self._what}", json={"signal": int(signal)}
        )
        return bool(answer.get("running"))

    def kill(self, signal: int = signals.SIGKILL) -> bool:
        """Send ``signal`` (SIGKILL by default) to the process and its group; whether it was running then."""
        return self._sandbox.http.run(self._kill(signal))

    async def _status(self) -> tuple[int, str]:
        info = await self._sandbox.request("GET", self._path(), what=f"status of {self._what}")
        if info.get("running"):
            return -1, "running"
        return int(info.get("exit_code") if info.get("exit_code") is not None else -1), "exited"

    def status(self) -> tuple[int, str]:
        """(exit code, ``"running"`` or ``"exited"``); the exit code is -1 while it runs."""
        return self._sandbox.http.run(self._status())

    @property
    def aio(self) -> AsyncSandboxProcess:
        """The same process, with coroutines for ``wait``, ``kill`` and ``status``."""
        return AsyncSandboxProcess(self)


class AsyncSandboxProcess:
    """:class:`SandboxProcess` for async code; its streams are the same objects (``async for line in p.stdout``)."""

    def __init__(self, process: SandboxProcess) -> None:
        self.sync = process
        self.pid = process.pid
        self.stdout = process.stdout
        self.stderr = process.stderr
        self.logs = process.logs

    async def wait(self, timeout: float | None = None) -> int:
        return await self.sync._wait(timeout)

    async def kill(self, signal: int = signals.SIGKILL) -> bool:
        return await self.sync._sandbox.http.run_async(self.sync._kill(signal))

    async def status(self) -> tuple[int, str]:
        return await self.sync._sandbox.http.run_async(self.sync._status())


#: the exec answers being read in the background (a task the loop alone refers to could be collected)
_readers: set[asyncio.Future[None]] = set()


def _started(raw: bytes, what: str) -> dict[str, Any]:
    """The started process's fields (``process``, ``pid``, ``argv``) out of the exec's answer or its first line."""
    try:
        info = json.loads(raw)
        int(info["process"])
    except (ValueError, KeyError, TypeError):
        raise SandboxError(
            f"{what}: the controlplane's answer is not a started process: {raw[:200]!r}", status=201
        ) from None
    started: dict[str, Any] = info
    return started


def _check_env(env: Mapping[str, str] | None) -> dict[str, str] | None:
    if env is None:
        return None
    if not isinstance(env, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise SandboxRequestError(f"env: expected a mapping of str to str, got {env!r}")
    return dict(env)


def _check_cwd(cwd: str | None) -> str | None:
    if cwd is not None and (not isinstance(cwd, str) or not cwd.startswith("/")):
        raise SandboxRequestError(f"cwd: expected an absolute path in the sandbox (such as '/tmp'), got {cwd!r}")
    return cwd


class SandboxProcessManager:
    """``sb.process``: start processes in the sandbox and find the ones running."""

    def __init__(self, sandbox: SandboxRef) -> None:
        self._sandbox = sandbox
        #: every process this object knows, by the sandbox's number for it
        self.processes: dict[int, SandboxProcess] = {}

    def _known(self, info: Mapping[str, Any]) -> SandboxProcess:
        number = int(info["process"])
        process = self.processes.get(number)
        if process is None:
            process = self.processes[number] = SandboxProcess(self._sandbox, info)
        elif info.get("pid"):
            process.pid = int(info["pid"])
        return process

    async def _start(self, body: dict[str, Any], what: str) -> SandboxProcess:
        """Start it with one request that waits (``?wait=true``): its answer is the process, then its output
        to its exit, read in the background; the process is returned once the first line came."""
        started: asyncio.Future[SandboxProcess] = asyncio.get_running_loop().create_future()
        task = asyncio.ensure_future(self._exec_waiting(body, what, started))
        _readers.add(task)
        task.add_done_callback(_readers.discard)
        try:
            return await asyncio.shield(started)
        except asyncio.CancelledError:
            task.cancel()
            raise

    async def _exec_waiting(self, body: dict[str, Any], what: str, started: asyncio.Future[SandboxProcess]) -> None:
        sandbox = self._sandbox
        path = sandbox.path("/processes")
        try:
            async with sandbox.http.stream(
                "POST", path, what=what, params={"wait": "true"}, json=body, read_timeout=None, sandbox_id=sandbox.id
            ) as response:
                if not response.headers.get("content-type", "").startswith("application/x-ndjson"):
                    # a controlplane without the exec that waits answers the plain start: read the output apart
                    process = self._known(_started(await response.aread(), what))
                    process._read()
                    started.set_result(process)
                    return
                lines = response.aiter_lines()
                try:
                    first = await asyncio.wait_for(anext(lines), REQUEST_TIMEOUT_S)
                except TimeoutError:
                    timeout = httpx.ReadTimeout(f"no answer within {REQUEST_TIMEOUT_S:g} s")
                    raise sandbox.http.unreachable(what, timeout, REQUEST_TIMEOUT_S) from None
                except StopAsyncIteration:
                    raise SandboxError(f"{what}: the controlplane's answer (201) is empty", status=201) from None
                process = self._known(_started(first.encode(), what))
                started.set_result(process)
                await process._read_rest(lines)
        except asyncio.CancelledError:
            started.cancel()
            raise
        except BaseException as exc:  # before the first line: the caller's error; after it, the output's
            if not started.done():
                if isinstance(exc, httpx.HTTPError):
                    exc = sandbox.http.unreachable(what, exc, REQUEST_TIMEOUT_S)
                started.set_exception(exc)
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                raise

    @staticmethod
    def _exec_body(args: Sequence[str], cwd: str | None, env: Mapping[str, str] | None) -> dict[str, Any]:
        if not args or not all(isinstance(a, str) for a in args):
            raise SandboxRequestError(f"exec: give the command and its arguments as strings, got {list(args)!r}")
        body: dict[str, Any] = {"argv": list(args)}
        if (checked_cwd := _check_cwd(cwd)) is not None:
            body["cwd"] = checked_cwd
        if (checked_env := _check_env(env)) is not None:
            body["env"] = checked_env
        return body

    @staticmethod
    def _code_body(code: str, cwd: str | None, env: Mapping[str, str] | None) -> dict[str, Any]:
        if not isinstance(code, str):
            raise SandboxRequestError(f"run_code: code must be Python source as a str, got {type(code).__name__}")
        body: dict[str, Any] = {"code": code}
        if (checked_cwd := _check_cwd(cwd)) is not None:
            body["cwd"] = checked_cwd
        if (checked_env := _check_env(env)) is not None:
            body["env"] = checked_env
        return body

    def exec(self, *args: str, cwd: str | None = None, env: Mapping[str, str] | None = None) -> SandboxProcess:
        """Start ``args`` (no shell: ``exec("sh", "-c", "...")`` for one) and return at once.

        ``cwd`` defaults to the sandbox's working directory; ``env`` is added to the sandbox's environment.
        """
        body = self._exec_body(args, cwd, env)
        return self._sandbox.http.run(self._start(body, f"exec {args[0]!r} in sandbox {self._sandbox.id}"))

    def run_code(
        self, code: str, blocking: bool = True, cwd: str | None = None, env: Mapping[str, str] | None = None
    ) -> SandboxProcessResponse | SandboxProcess:
        """Run Python ``code`` in the sandbox's Python; blocking: wait and return its exit code and output."""
        body = self._code_body(code, cwd, env)
        process = self._sandbox.http.run(self._start(body, f"run_code in sandbox {self._sandbox.id}"))
        if not blocking:
            return process
        exit_code = process.wait()
        return SandboxProcessResponse(process.pid, exit_code, process.stdout.read(), process.stderr.read())

    async def _list(self) -> dict[int, SandboxProcess]:
        answer = await self._sandbox.request("GET", "/processes", what=f"processes of sandbox {self._sandbox.id}")
        found = [self._known(info) for info in answer.get("processes", [])]
        return {process.pid: process for process in found}

    def list_processes(self) -> dict[int, SandboxProcess]:
        """The sandbox's processes (running and ended, as the sandbox keeps them), by pid."""
        return self._sandbox.http.run(self._list())

    @staticmethod
    def _pick(found: dict[int, SandboxProcess], pid: int, sandbox_id: str) -> SandboxProcess:
        if pid in found:
            return found[pid]
        known = ", ".join(str(p) for p in sorted(found)) or "none"
        raise SandboxProcessError(
            f"no process with pid {pid} in sandbox {sandbox_id} (its processes' pids: {known})",
            type="NoSuchProcess",
            sandbox_id=sandbox_id,
        )

    def get_process(self, pid: int) -> SandboxProcess:
        """The process of ``pid``; SandboxProcessError when the sandbox has none."""
        return self._pick(self.list_processes(), pid, self._sandbox.id)

    @property
    def aio(self) -> AsyncSandboxProcessManager:
        """The same manager with coroutines: ``await sb.process.aio.exec(...)``."""
        return AsyncSandboxProcessManager(self)


class AsyncSandboxProcessManager:
    """:class:`SandboxProcessManager` for async code; processes it returns are :class:`AsyncSandboxProcess`."""

    def __init__(self, manager: SandboxProcessManager) -> None:
        self.sync = manager
        self._run: Callable[[Any], Any] = manager._sandbox.http.run_async

    async def exec(
        self, *args: str, cwd: str | None = None, env: Mapping[str, str] | None = None
    ) -> AsyncSandboxProcess:
        body = self.sync._exec_body(args, cwd, env)
        what = f"exec {args[0]!r} in sandbox {self.sync._sandbox.id}"
        return AsyncSandboxProcess(await self._run(self.sync._start(body, what)))

    async def run_code(
        self, code: str, blocking: bool = True, cwd: str | None = None, env: Mapping[str, str] | None = None
    ) -> SandboxProcessResponse | AsyncSandboxProcess:
        body = self.sync._code_body(code, cwd, env)
        process = await self._run(self.sync._start(body, f"run_code in sandbox {self.sync._sandbox.id}"))
        if not blocking:
            return AsyncSandboxProcess(process)
        exit_code = await process._wait()
        return SandboxProcessResponse(
            process.pid, exit_code, await process.stdout.read_aio(), await process.stderr.read_aio()
        )

    async def list_processes(self) -> dict[int, AsyncSandboxProcess]:
        found = await self._run(self.sync._list())
        return {pid: AsyncSandboxProcess(process) for pid, process in found.items()}

    async def get_process(self, pid: int) -> AsyncSandboxProcess:
        found = await self._run(self.sync._list())
        return AsyncSandboxProcess(self.sync._pick(found, pid, self.sync._sandbox.id))
