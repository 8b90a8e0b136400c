"""``@levers9.function`` and what it returns: a local function that can also run remotely.

The decorated object still runs locally when called directly; ``.remote``
runs one call on a worker and returns its value, ``.spawn`` starts one and
returns a handle, ``.map`` runs one call per input with many in flight and
yields results in input order. The GPU preference is checked here, on the
user's machine, so a misspelt GPU type fails before anything is sent.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import inspect
import json
import linecache
import math
import re
import sys
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from typing import Any, Generic, ParamSpec, TypeVar

import grpc

from levers9 import stub_bounds as bounds
from levers9.payloads import BATCH_BYTES, INLINE_MAX_BYTES, REF_PREFIX, PayloadTooLarge
from levers9.proto.v1 import controlplane_pb2
from levers9.quantities import NotAQuantity, parse_cpu_millicores, parse_memory_mib
from levers9.sdk import blobs, serialize
from levers9.sdk.client import Client, client_for, translate
from levers9.sdk.errors import CallCancelled, CallTimeout, InvalidFunction, RemoteError, RemoteTraceback

__all__ = ["Function", "FunctionCall", "endpoint", "function", "queue"]

P = ParamSpec("P")
R = TypeVar("R")

#: calls sent per Submit
_BATCH = 500
#: calls of one map in flight at once, by default
DEFAULT_MAP_CONCURRENCY = 2000


_DYNAMIC = re.compile(r'^(\s*)File "<dynamic-code>", line (\d+), in (.+)$')


def _with_sources(text: str, source_file: str | None) -> str:
    """Put file names and source lines back into a remote traceback of code sent by value.

    Code pickled by value loses its file name (cloudpickle writes ``<dynamic-code>``)
    but keeps its line numbers, and the caller has the file: the user's own script.
    """
    if not source_file:
        return text
    out: list[str] = []
    for line in text.splitlines():
        match = _DYNAMIC.match(line)
        if match is None:
            out.append(line)
            continue
        indent, number, name = match.groups()
        out.append(f'{indent}File "{source_file}", line {number}, in {name}')
        source = linecache.getline(source_file, int(number)).strip()
        if source:
            out.append(f"{indent}    {source}")
    return "\n".join(out) + "\n"


def _outcome(result: controlplane_pb2.TaskEvent, source_file: str | None = None) -> Any:
    """The call's value, or raise what it raised (with the remote traceback as its cause)."""
    r = result.result
    if r.status == "complete":
        return serialize.loads(r.result)
    error = r.error
    if r.status == "timeout":
        raise CallTimeout(error.message or f"task {r.task_id} ran past its timeout")
    if r.status == "cancelled":
        raise CallCancelled(f"task {r.task_id} was cancelled")
    exc: BaseException | None = None
    if r.result:
        try:
            loaded = serialize.loads(r.result)
            if isinstance(loaded, BaseException):
                exc = loaded
        except Exception:
            exc = None
    if exc is None:
        exc = RemoteError(error.type or r.status, error.message or "the call failed")
    if error.traceback:
        exc.__cause__ = RemoteTraceback(_with_sources(error.traceback, source_file))
    raise exc


class FunctionCall(Generic[R]):
    """A call started with ``spawn``: wait for it with :meth:`get`, stop it with :meth:`cancel`."""

    def __init__(self, client: Client, task_id: str, source: str | None = None) -> None:
        self.client = client
        self.task_id = task_id
        self._source = source

    def __repr__(self) -> str:
        return f"FunctionCall({self.task_id!r})"

    def get(self, timeout: float | None = None) -> R:
        event = self.client.run(_watch_one(self.client, self.task_id), timeout)
        value: R = _outcome(event, self._source)
        return value

    def cancel(self) -> bool:
        async def cancel() -> bool:
            try:
                response = await self.client.stub.CancelTask(
                    controlplane_pb2.CancelTaskRequest(task_id=self.task_id), metadata=self.client.metadata
                )
            except grpc.aio.AioRpcError as exc:
                raise translate(exc, self.client.ctx) from None
            return bool(response.cancelled)

        return self.client.run(cancel())


#: how long a watch keeps reconnecting to a controlplane that went away (a restart, a failover)
RECONNECT_S = 120.0


async def _watch(client: Client, task_ids: Sequence[str]) -> AsyncIterator[controlplane_pb2.TaskEvent]:
    """Outcomes of ``task_ids`` as they finish, riding out a controlplane restart.

    Tasks live in SQL, so a watch that breaks because the controlplane went
    away is simply opened again for the tasks not yet seen.
    """
    waiting = list(dict.fromkeys(task_ids))
    left = set(waiting)
    deadline: float | None = None
    delay = 0.2
    while waiting:
        try:
            async for batch in client.stub.WatchMany(
                controlplane_pb2.WatchRequest(task_ids=waiting), metadata=client.metadata
            ):
                for event in batch.events:
                    if event.HasField("result") and event.task_id in left:
                        left.discard(event.task_id)
                        deadline, delay = None, 0.2
                        yield event
                waiting = [t for t in waiting if t in left]
            if waiting:
                raise RuntimeError(f"the controlplane ended a watch with {len(waiting)} tasks unfinished")
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN):
                raise translate(exc, client.ctx) from None
            now = asyncio.get_running_loop().time()
            deadline = deadline or now + RECONNECT_S
            if now > deadline:
                raise translate(exc, client.ctx) from None
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)


async def _outgoing(client: Client, payload: bytes) -> bytes:
    """``payload`` as it travels: itself when small, else stored first as a blob and named by reference."""
    if len(payload) <= INLINE_MAX_BYTES:
        return payload
    try:
        if client.max_payload_bytes is None:
            who = await client.stub.WhoAmI(controlplane_pb2.WhoAmIRequest(), metadata=client.metadata)
            client.max_payload_bytes = who.max_payload_bytes or None
        if client.max_payload_bytes is not None and len(payload) > client.max_payload_bytes:
            raise PayloadTooLarge("the call's arguments", len(payload), client.max_payload_bytes)
        ref: bytes = await blobs.upload(client.stub.PutBlob, payload, metadata=client.metadata)
        return ref
    except grpc.aio.AioRpcError as exc:
        if exc.code() == grpc.StatusCode.INVALID_ARGUMENT and "over the cap" in (exc.details() or ""):
            raise PayloadTooLarge("the call's arguments", len(payload), 0, message=exc.details()) from None
        raise translate(exc, client.ctx) from None


async def _incoming(client: Client, event: controlplane_pb2.TaskEvent) -> controlplane_pb2.TaskEvent:
    """``event`` with its result itself in place of a reference to a stored blob."""
    if not event.result.result.startswith(REF_PREFIX):
        return event
    try:
        data = await blobs.download(client.stub.GetBlob, event.result.result, metadata=client.metadata)
    except grpc.aio.AioRpcError as exc:
        raise translate(exc, client.ctx) from None
    resolved = controlplane_pb2.TaskEvent()
    resolved.CopyFrom(event)
    resolved.result.result = data
    return resolved


async def _watch_one(client: Client, task_id: str) -> controlplane_pb2.TaskEvent:
    async for event in _watch(client, [task_id]):
        return await _incoming(client, event)
    raise RuntimeError(f"the controlplane ended the watch of {task_id} without its result")


class Function(Generic[P, R]):
    def __init__(self, fn: Callable[P, R], config: dict[str, Any]) -> None:
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.config = config
        self._handler: bytes | None = None
        code = getattr(fn, "__code__", None)
        #: where the function's source is, to restore it in remote tracebacks
        self._source: str | None = code.co_filename if code is not None else None

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run locally, in this process."""
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<levers9.Function {self.config['name']}>"

    # ------------------------------------------------------------------ registration

    def _client(self) -> Client:
        return client_for(None)

    async def _stub_id(self, client: Client) -> str:
        if self._handler is None:
            self._handler = serialize.dumps_function(self.fn)
        digest = hashlib.sha256(json.dumps(self.config, sort_keys=True).encode() + self._handler).hexdigest()
        key = (id(self), digest)
        known = client.stub_ids.get(key)
        if known is not None:
            return known
        c = self.config
        config = controlplane_pb2.StubConfig(
            kind=c["kind"], app=c["app"], name=c["name"], image=c["image"],
            cpu_millicores=c["cpu_millicores"], memory_mib=c["memory_mib"], gpu=c["gpu"], gpu_count=c["gpu_count"],
            retries=c["retries"], timeout_s=c["timeout_s"], secrets=c["secrets"], env=c["env"],
            python_version=f"{sys.version_info.major}.{sys.version_info.minor}",
            checkpoint_enabled=c["checkpoint_enabled"],
        )  # fmt: skip
        if c["fallback_after_s"] is not None:
            config.fallback_after_s = c["fallback_after_s"]
        if c["keep_warm_s"] is not None:
            config.keep_warm_s = c["keep_warm_s"]
        serving = c.get("serving") or {}
        for field_name, value in serving.items():
            if field_name == "ports":
                config.ports.extend(value)
            elif value is not None:
                setattr(config, field_name, value)
        try:
            response = await client.stub.GetOrCreateStub(
                controlplane_pb2.GetOrCreateStubRequest(config=config, handler=self._handler),
                metadata=client.metadata,
            )
        except grpc.aio.AioRpcError as exc:
            raise translate(exc, client.ctx) from None
        client.stub_ids[key] = response.stub_id
        return str(response.stub_id)

    # ------------------------------------------------------------------ calling

    def remote(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run one call on a worker and return its value (or raise what it raised)."""
        client = self._client()
        event = client.run(self._invoke(client, self._arguments(args, kwargs)))
        value: R = _outcome(event, self._source)
        return value

    async def remote_aio(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """``remote`` for async code: awaits without blocking the caller's event loop."""
        client = self._client()
        event = await client.run_async(self._invoke(client, self._arguments(args, kwargs)))
        value: R = _outcome(event, self._source)
        return value

    def _arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
        """The call's pickled arguments."""
        return serialize.dumps_args(args, kwargs)

    async def _invoke(self, client: Client, payload: bytes) -> controlplane_pb2.TaskEvent:
        stub_id = await self._stub_id(client)
        payload = await _outgoing(client, payload)
        task_id = ""
        try:
            async for event in client.stub.Invoke(
                controlplane_pb2.InvokeRequest(stub_id=stub_id, args=payload), metadata=client.metadata
            ):
                task_id = event.task_id
                if event.HasField("result"):
                    return await _incoming(client, event)
        except grpc.aio.AioRpcError as exc:
            if not task_id or exc.code() != grpc.StatusCode.UNAVAILABLE:
                raise translate(exc, client.ctx) from None
            # the call is stored: follow it to its end across the controlplane's restart
        if not task_id:
            raise RuntimeError("the controlplane ended the call without its result")
        return await _watch_one(client, task_id)

    def spawn(self, *args: P.args, **kwargs: P.kwargs) -> FunctionCall[R]:
        """Start one call and return at once; ``.get()`` on the handle waits for its value."""
        client = self._client()
        [task_id] = client.run(self._submit(client, [self._arguments(args, kwargs)]))
        return FunctionCall(client, task_id, self._source)

    async def _submit(self, client: Client, payloads: Sequence[bytes]) -> list[str]:
        stub_id = await self._stub_id(client)
        payloads = [await _outgoing(client, p) for p in payloads]
        try:
            response = await client.stub.Submit(
                controlplane_pb2.SubmitRequest(
                    stub_id=stub_id, calls=[controlplane_pb2.Call(args=p) for p in payloads]
                ),
                metadata=client.metadata,
            )
        except grpc.aio.AioRpcError as exc:
            raise translate(exc, client.ctx) from None
        return list(response.task_ids)

    async def _submit_and_watch(
        self, client: Client, payloads: Sequence[bytes], accepted: asyncio.Future[list[str]]
    ) -> AsyncIterator[controlplane_pb2.TaskEvent]:
        """Submit calls and yield their outcomes as they finish; ``accepted`` gets the task ids once stored.

        One stream does both, so the controlplane need not look the tasks up again to watch them. If the
        stream breaks after the ids came (a controlplane restart), the rest is followed with a watch.
        """
        stub_id = await self._stub_id(client)
        ids: list[str] = []
        left: set[str] = set()
        try:
            async for batch in client.stub.SubmitAndWatch(
                controlplane_pb2.SubmitRequest(
                    stub_id=stub_id, calls=[controlplane_pb2.Call(args=p) for p in payloads]
                ),
                metadata=client.metadata,
            ):
                if not ids:
                    ids = [event.task_id for event in batch.events]
                    left = set(ids)
                    accepted.set_result(ids)
                    continue
                for event in batch.events:
                    if event.HasField("result") and event.task_id in left:
                        left.discard(event.task_id)
                        yield event
        except grpc.aio.AioRpcError as exc:
            if not ids or exc.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL):
                raise translate(exc, client.ctx) from None
        if not ids:
            raise RuntimeError("the controlplane ended the submit without the calls' task ids")
        if left:
            async for event in _watch(client, [t for t in ids if t in left]):
                yield event

    def map(
        self,
        *iterables: Iterable[Any],
        kwargs: dict[str, Any] | None = None,
        concurrency: int = DEFAULT_MAP_CONCURRENCY,
        return_exceptions: bool = False,
        progress: bool | None = None,
    ) -> Iterator[R]:
        """One call per input (``zip`` of ``iterables``), results in input order.

        At most ``concurrency`` calls are in flight at once, so a huge input is
        streamed rather than queued whole. With ``return_exceptions`` a failed
        call yields its exception instead of raising it. A progress bar is shown
        when stderr is a terminal (``progress`` forces it on or off).
        """
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        inputs = zip(*iterables, strict=False)
        extra = kwargs or {}
        payloads = (serialize.dumps_args(tuple(args), extra) for args in inputs)
        total = _length(iterables)
        show = sys.stderr.isatty() if progress is None else progress
        client = self._client()
        queue: Any = __import__("queue").Queue()
        done = object()

        async def produce() -> None:
            try:
                async for index, event in self._stream(client, payloads, concurrency):
                    queue.put((index, event))
            except BaseException as exc:  # handed to the consuming thread
                queue.put((-1, exc))
            finally:
                queue.put((-2, done))

        future = asyncio.run_coroutine_threadsafe(produce(), client._loop)
        bar = _Progress(total, self.config["name"]) if show else None
        buffered: dict[int, controlplane_pb2.TaskEvent] = {}
        next_index = 0
        try:
            while True:
                index, item = queue.get()
                if index == -2:
                    break
                if index == -1:
                    raise item
                buffered[index] = item
                if bar is not None:
                    bar.advance()
                while next_index in buffered:
                    event = buffered.pop(next_index)
                    next_index += 1
                    if return_exceptions:
                        try:
                            yield _outcome(event, self._source)
                        except Exception as exc:
                            yield exc  # type: ignore[misc]
                    else:
                        yield _outcome(event, self._source)
        finally:
            future.cancel()
            if bar is not None:
                bar.close()

    async def _stream(
        self, client: Client, payloads: Iterator[bytes], concurrency: int
    ) -> AsyncIterator[tuple[int, controlplane_pb2.TaskEvent]]:
        """Submit in batches, keep at most ``concurrency`` unfinished, yield (input index, outcome) as they finish."""
        results: asyncio.Queue[tuple[int, controlplane_pb2.TaskEvent] | BaseException] = asyncio.Queue()
        slots = asyncio.Semaphore(concurrency)
        watchers: list[asyncio.Task[None]] = []
        submitted = 0
        finished = 0

        async def watch(batch: list[bytes], first: int, accepted: asyncio.Future[list[str]]) -> None:
            index: dict[str, int] = {}
            try:
                async for event in self._submit_and_watch(client, batch, accepted):
                    if not index:
                        index = {task_id: first + i for i, task_id in enumerate(accepted.result())}
                    if event.task_id in index:
                        slots.release()
                        await results.put((index.pop(event.task_id), await _incoming(client, event)))
            except asyncio.CancelledError:
                accepted.cancel()
                raise
            except BaseException as exc:
                if accepted.done():
                    await results.put(exc)
                else:  # the submit itself failed: the submitter raises it
                    accepted.set_exception(exc)

        # Once the first window is out, calls go in chunks of a quarter window as results free room:
        # one Submit and one Watch per chunk, not per call, while the window stays mostly full.
        chunk = max(1, min(_BATCH, concurrency // 4))

        async def submit_all() -> None:
            nonlocal submitted
            batch: list[bytes] = []
            batch_bytes = 0
            exhausted = False
            while not exhausted:
                await slots.acquire()
                payload = next(payloads, None)
                if payload is None:
                    slots.release()
                    exhausted = True
                else:
                    payload = await _outgoing(client, payload)  # a big one goes ahead of its call, as a blob
                    batch.append(payload)
                    batch_bytes += len(payload)
                first_window = submitted + len(batch) <= concurrency
                # a batch is one message: cut it by size too, well under what a channel accepts
                full = len(batch) >= (_BATCH if first_window else chunk) or batch_bytes >= BATCH_BYTES
                if batch and (exhausted or full or (first_window and slots.locked())):
                    accepted: asyncio.Future[list[str]] = asyncio.get_running_loop().create_future()
                    watchers.append(asyncio.create_task(watch(batch, submitted, accepted)))
                    # the next batch goes once this one is stored: calls are queued in input order, and a
                    # refused submit (no pool can run it) stops the map before more is sent
                    submitted += len(await accepted)
                    batch, batch_bytes = [], 0

        submitter = asyncio.create_task(submit_all())
        try:
            while True:
                if submitter.done() and finished == submitted:
                    submitter.result()
                    return
                if submitter.done():
                    submitter.result()  # raises what submitting raised
                    item = await results.get()
                else:
                    getter = asyncio.create_task(results.get())
                    await asyncio.wait({getter, submitter}, return_when=asyncio.FIRST_COMPLETED)
                    if not getter.done():
                        getter.cancel()
                        continue
                    item = getter.result()
                if isinstance(item, BaseException):
                    raise item
                finished += 1
                yield item
        finally:
            submitter.cancel()
            for w in watchers:
                w.cancel()


def _length(iterables: Sequence[Iterable[Any]]) -> int | None:
    lengths = [len(i) for i in iterables if hasattr(i, "__len__")]  # type: ignore[arg-type]
    return min(lengths) if lengths and len(lengths) == len(iterables) else None


class _Progress:
    def __init__(self, total: int | None, name: str) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._progress = Progress(
            TextColumn(f"{name}.map"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), transient=True
        )
        self._task = self._progress.add_task(name, total=total)
        self._progress.start()

    def advance(self) -> None:
        self._progress.advance(self._task)

    def close(self) -> None:
        self._progress.stop()


# ---------------------------------------------------------------------- decorators


def _config(fn: Callable[..., Any], kind: str, **options: Any) -> dict[str, Any]:
    from levers9.gpu.preference import parse_gpu

    gpu = options.pop("gpu")
    gpu_count = options.pop("gpu_count")
    fallback = options.pop("fallback")
    fallback_after = options.pop("fallback_after")
    try:
        request = parse_gpu(gpu, gpu_count, fallback=fallback, fallback_after=fallback_after)
    except (ValueError, TypeError) as exc:
        raise InvalidFunction(f"{fn.__qualname__}: gpu: {exc}") from None
    preference = list(request.types) or (["any"] if request.any_gpu else [])
    if request.fallback_cpu:
        preference.append("cpu")
    where = fn.__qualname__
    try:
        cpu_millicores = parse_cpu_millicores(
            options.pop("cpu"), field="cpu", minimum=bounds.CPU_MILLICORES_MIN, maximum=bounds.CPU_MILLICORES_MAX
        )
        memory_mib = parse_memory_mib(
            options.pop("memory"), field="memory", minimum=bounds.MEMORY_MIB_MIN, maximum=bounds.MEMORY_MIB_MAX
        )
    except NotAQuantity as exc:
        raise InvalidFunction(f"{where}: {exc}") from None
    timeout = _seconds(where, "timeout", options.pop("timeout"), above=0.0, none_means="no timeout")
    retries = _whole(where, "retries", options.pop("retries"), bounds.RETRIES_MIN, bounds.RETRIES_MAX)
    keep_warm = _seconds(
        where, "keep_warm", options.pop("keep_warm"), least=bounds.KEEP_WARM_S_MIN, most=bounds.KEEP_WARM_S_MAX,
        none_means="the default",
    )  # fmt: skip
    name = options.pop("name") or fn.__qualname__.replace("<locals>.", "")
    if not isinstance(name, str) or not bounds.NAME_LENGTH_MIN <= len(name) <= bounds.NAME_LENGTH_MAX:
        raise InvalidFunction(
            f"{where}: name: {name!r} is not a name; use a string of {bounds.NAME_LENGTH_MIN} to "
            f"{bounds.NAME_LENGTH_MAX} characters"
        )
    secrets = options.pop("secrets") or ()
    return {
        "kind": kind,
        "app": options.pop("app") or _app_name(fn),
        "name": name,
        "image": options.pop("image"),
        "cpu_millicores": cpu_millicores,
        "memory_mib": memory_mib,
        "gpu": preference,
        "gpu_count": request.count if request.wants_gpu else 0,
        "fallback_after_s": fallback_after,
        "retries": retries,
        "timeout_s": timeout or 0.0,
        "secrets": [secrets] if isinstance(secrets, str) else list(secrets),
        "env": dict(options.pop("env") or {}),
        "keep_warm_s": keep_warm,
        "checkpoint_enabled": bool(options.pop("checkpoint", False)),
    }


def _whole(where: str, option: str, value: object, least: int, most: int, *, none_ok: bool = False) -> int | None:
    """A whole-number option, checked against the bounds the controlplane enforces (levers9.stub_bounds)."""
    if value is None and none_ok:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidFunction(f"{where}: {option}: {value!r} is not a whole number; use an int from {least} to {most}")
    if not least <= value <= most:
        raise InvalidFunction(f"{where}: {option}: {value} is out of range; use an int from {least} to {most}")
    return value


def _seconds(
    where: str,
    option: str,
    value: object,
    *,
    above: float | None = None,
    least: float | None = None,
    most: float | None = None,
    none_means: str,
) -> float | None:
    """A duration in seconds (None: ``none_means``), checked against the controlplane's bounds."""
    lower = f"above {above:g}" if above is not None else f"at least {least:g}" if least is not None else ""
    upper = f"at most {most:g}" if most is not None else ""
    accepted = f"use seconds as a number ({' and '.join(p for p in (lower, upper) if p)}), or None for {none_means}"
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidFunction(f"{where}: {option}: {value!r} is not a number of seconds; {accepted}")
    if (
        (above is not None and value <= above)
        or (least is not None and value < least)
        or (most is not None and value > most)
    ):
        raise InvalidFunction(f"{where}: {option}: {value} is out of range; {accepted}")
    return float(value)


def _app_name(fn: Callable[..., Any]) -> str:
    module = getattr(fn, "__module__", "") or "app"
    if module == "__main__":
        file = getattr(sys.modules.get("__main__"), "__file__", None)
        if file:
            from pathlib import Path

            return Path(file).stem
    return module.rsplit(".", 1)[-1]


def function(
    _fn: Callable[P, R] | None = None,
    *,
    cpu: float | str = 0.125,
    memory: int | str = 128,
    gpu: str | Sequence[str] | None = None,
    gpu_count: int | None = None,
    fallback: str | Sequence[str] | None = None,
    fallback_after: float | None = None,
    retries: int = 0,
    timeout: float | None = None,
    secrets: str | Sequence[str] | None = None,
    env: dict[str, str] | None = None,
    image: str = "host",
    keep_warm: float | None = None,
    checkpoint: bool = False,
    app: str | None = None,
    name: str | None = None,
) -> Any:
    """Make a function runnable on levers9 workers: ``f.remote(...)``, ``f.map(...)``, ``f.spawn(...)``.

    ``gpu`` is a GPU type, a list in order of preference (the first with free
    capacity wins), ``"any"``, or None for CPU. ``fallback="cpu"`` (or ``"cpu"``
    as the last entry of ``gpu``) runs the call on CPU when no listed GPU can be
    had within ``fallback_after`` seconds. ``cpu`` is in cores (``0.5``, ``2``)
    or millicores (``"500m"``); ``memory`` is MiB as a number (``512``) or a
    size (``"256Mi"``, ``"1Gi"``, ``"16GiB"``; every unit is 1024-based, so
    ``"16GB"`` is 16 GiB); ``timeout`` is in seconds. ``retries`` reruns a call
    that raised, up to that many more times. Every option is checked here,
    against the bounds the controlplane enforces, and a bad one raises
    :class:`~levers9.sdk.errors.InvalidFunction` (a ``ValueError``) naming it. ``secrets`` names workspace secrets to expose as
    environment variables; ``env`` adds plain ones. ``checkpoint=True``
    snapshots the first container once its start-up (the module's top-level
    code: imports, model loading) is done, where the pool's runtime can; later
    containers of the function start from that snapshot instead of running it
    again. A long-running server calls :func:`levers9.ready` itself instead.
    """
    if isinstance(fallback, str):
        fallback = [fallback]

    def wrap(fn: Callable[P, R]) -> Function[P, R]:
        if inspect.isclass(fn):
            raise InvalidFunction(f"@levers9.function decorates functions, not classes ({fn.__qualname__})")
        config = _config(
            fn, "function", cpu=cpu, memory=memory, gpu=gpu, gpu_count=gpu_count, fallback=fallback,
            fallback_after=fallback_after, retries=retries, timeout=timeout, secrets=secrets, env=env,
            image=image, keep_warm=keep_warm, checkpoint=checkpoint, app=app, name=name,
        )  # fmt: skip
        return Function(fn, config)

    return wrap(_fn) if _fn is not None else wrap


def endpoint(
    _fn: Callable[P, R] | None = None,
    *,
    asgi: bool = False,
    public: bool = False,
    min_containers: int | None = None,
    max_containers: int | None = None,
    tasks_per_container: int | None = None,
    max_pending: int | None = None,
    start_timeout: float | None = None,
    **options: Any,
) -> Any:
    """An HTTP endpoint, served by the gateway at ``/endpoint/NAME/vN`` once deployed (``levers9 deploy``).

    By default the function is called per request with the JSON body as its
    arguments and its return value is the JSON response (a generator streams).
    ``asgi=True``: the function takes no arguments and returns an ASGI app
    (FastAPI, Starlette), which serves every path under the endpoint's URL.
    Containers scale with the requests in flight, ``tasks_per_container`` at a
    time each, between ``min_containers`` (default 0: scale to zero once idle
    for ``keep_warm`` seconds) and ``max_containers``. Up to ``max_pending``
    requests wait for room, each at most ``start_timeout`` seconds; more are
    answered 429, and a wait that runs out 504; ``timeout`` bounds how long a
    container may take to begin its answer (then 504). ``public=True`` lets
    anyone call it without a token. Other options are :func:`function`'s.
    """
    serving = {
        "interface": "asgi" if asgi else "function",
        "public": public,
        "min_containers": min_containers,
        "max_containers": max_containers,
        "tasks_per_container": tasks_per_container,
        "max_pending": max_pending,
        "start_timeout_s": start_timeout,
    }
    return _other_kind("endpoint", _fn, serving, options)


def asgi(_fn: Callable[P, R] | None = None, **options: Any) -> Any:
    """``@levers9.endpoint(asgi=True)``: the function returns an ASGI app that the endpoint serves."""
    return endpoint(_fn, asgi=True, **options)


def queue(_fn: Callable[P, R] | None = None, **options: Any) -> Any:
    """A queue consumer: ``POST /queue/NAME/vN`` with a JSON body enqueues a call and returns its task id.

    Each item is one call of the function (arguments as an endpoint's), retried
    up to ``retries`` times when it raises; containers start as items wait and
    stop after ``keep_warm`` idle seconds. The result is read at
    ``/queue/NAME/vN/tasks/ID``. Options are :func:`function`'s.
    """
    return _other_kind("queue", _fn, {}, options)


def job(_fn: Callable[P, R] | None = None, **options: Any) -> Any:
    """A job: ``POST /job/NAME/vN`` starts a run with the JSON body as arguments and returns its task id."""
    return _other_kind("job", _fn, {}, options)


def box(
    _fn: Callable[P, R] | None = None,
    *,
    ports: Sequence[int],
    min_containers: int | None = None,
    max_containers: int | None = None,
    start_timeout: float | None = None,
    **options: Any,
) -> Any:
    """A long-running box: the function starts a server on ``ports`` and does not return.

    Once deployed, one container runs it (``min_containers``, default 1) and the
    gateway proxies ``/box/NAME/vN/PORT/...`` to its port ``PORT``. The box is
    ready when every port accepts connections.
    """
    serving = {
        "ports": list(ports),
        "min_containers": min_containers,
        "max_containers": max_containers,
        "start_timeout_s": start_timeout,
    }
    return _other_kind("box", _fn, serving, options)


def _other_kind(kind: str, fn: Callable[..., Any] | None, serving: dict[str, Any], options: dict[str, Any]) -> Any:
    def wrap(f: Callable[..., Any]) -> Function[Any, Any]:
        decorated: Function[Any, Any] = function(f, **options)
        _check_serving(f.__qualname__, serving)
        decorated.config["kind"] = kind
        if serving:
            decorated.config["serving"] = serving
        return decorated

    return wrap(fn) if fn is not None else wrap


def _check_serving(where: str, serving: dict[str, Any]) -> None:
    """Check an endpoint's or box's own options against the controlplane's bounds, as :func:`function` does."""
    for option, field, least, most in (
        ("min_containers", "min_containers", bounds.MIN_CONTAINERS_MIN, bounds.MIN_CONTAINERS_MAX),
        ("max_containers", "max_containers", bounds.MAX_CONTAINERS_MIN, bounds.MAX_CONTAINERS_MAX),
        ("tasks_per_container", "tasks_per_container", bounds.TASKS_PER_CONTAINER_MIN, bounds.TASKS_PER_CONTAINER_MAX),
        ("max_pending", "max_pending", bounds.MAX_PENDING_MIN, bounds.MAX_PENDING_MAX),
    ):
        if field in serving:
            _whole(where, option, serving[field], least, most, none_ok=True)
    if "start_timeout_s" in serving:
        _seconds(
            where, "start_timeout", serving["start_timeout_s"], above=bounds.START_TIMEOUT_S_ABOVE,
            most=bounds.START_TIMEOUT_S_MAX, none_means="the default",
        )  # fmt: skip
    low, high = serving.get("min_containers"), serving.get("max_containers")
    if low is not None and high is not None and low > high:
        raise InvalidFunction(f"{where}: min_containers ({low}) is above max_containers ({high})")
    for port in serving.get("ports", ()):
        _whole(where, "ports", port, bounds.PORT_MIN, bounds.PORT_MAX)


def register(fn: Function[Any, Any], context: str | None = None) -> str:
    """Register ``fn``'s stub now (``levers9 deploy`` and tests); returns its id."""
    client = client_for(context)
    return client.run(fn._stub_id(client))
