"""Calling a registered function and following its calls: one call, a spawned call, outcomes, watches.

:func:`invoke` runs one call and returns its outcome event; :func:`submit`
stores calls and returns their task ids; :func:`submit_and_watch` does both on
one stream (for ``map``); :func:`watch` follows calls already stored to their
end; :class:`FunctionCall` is the handle ``spawn`` returns; :func:`outcome`
turns an outcome event into the call's value or raises what it raised, with
the remote traceback (and the caller's own source lines) as its cause.

Invariants: arguments over the inline limit travel as a stored blob named by
reference (:func:`outgoing`) and a result stored that way is fetched back
(:func:`incoming`), so callers only ever see whole payloads. Tasks live in
the SQL and Redis every replica shares, so a watch broken by a controlplane
restart or a replica's death (UNAVAILABLE, INTERNAL, UNKNOWN) is opened again,
on the next replica, for the tasks not yet seen, until the context's
``reconnect_s`` passes without reaching any replica (:mod:`levers9.sdk.client`);
every other gRPC error is translated into the SDK's own errors.

Exactly once: a submission (``Invoke``, ``Submit``, ``SubmitAndWatch``)
carries a ``submission_id`` the client makes once per batch. When its
connection breaks before the task ids came, the same request goes to the next
replica; the controlplane derives the task ids from the submission, so a batch
that the first replica had stored is found, not stored again. Once the ids
came, the calls are followed by id, never submitted again.
"""

from __future__ import annotations

import asyncio
import linecache
import re
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any, Generic, TypeVar

import grpc

from levers9.backoff import Backoff
from levers9.payloads import INLINE_MAX_BYTES, REF_PREFIX, PayloadTooLarge
from levers9.proto.v1 import controlplane_pb2
from levers9.sdk import blobs, serialize
from levers9.sdk.client import GONE, Client, translate
from levers9.sdk.errors import CallCancelled, CallTimeout, RemoteError, RemoteTraceback

__all__ = [
    "FunctionCall",
    "incoming",
    "invoke",
    "outcome",
    "outgoing",
    "submit",
    "submit_and_watch",
    "watch",
    "watch_one",
]

R = TypeVar("R")

#: the codes of a watch broken by its replica going away, rather than refused by a live one
_BROKEN = (*GONE, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)

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


def outcome(result: controlplane_pb2.TaskEvent, source_file: str | None = None) -> Any:
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
        event = self.client.run(watch_one(self.client, self.task_id), timeout)
        value: R = outcome(event, self._source)
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


async def watch(client: Client, task_ids: Sequence[str]) -> AsyncIterator[controlplane_pb2.TaskEvent]:
    """Outcomes of ``task_ids`` as they finish, riding out a controlplane restart or a replica's death.

    Tasks live in the state every replica shares, so a watch that breaks because its replica went
    away is simply opened again, on the next replica, for the tasks not yet seen.
    """
    waiting = list(dict.fromkeys(task_ids))
    left = set(waiting)
    refused = Backoff(initial_s=0.2, cap_s=5.0)  # a live replica failing the watch is not asked again at once
    while waiting:
        stub, generation = await client.connect()
        try:
            async for batch in stub.WatchMany(
                controlplane_pb2.WatchRequest(task_ids=waiting), metadata=client.metadata
            ):
                client.reached()
                for event in batch.events:
                    if event.HasField("result") and event.task_id in left:
                        left.discard(event.task_id)
                        yield event
                waiting = [t for t in waiting if t in left]
            if waiting:
                raise RuntimeError(f"the controlplane ended a watch with {len(waiting)} tasks unfinished")
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in _BROKEN:
                raise translate(exc, client.ctx) from None
            await client.lost(exc, generation)
            if exc.code() not in GONE:
                await asyncio.sleep(refused.next_s())


async def outgoing(client: Client, payload: bytes) -> bytes:
    """``payload`` as it travels: itself when small, else stored first as a blob and named by reference."""
    if len(payload) <= INLINE_MAX_BYTES:
        return payload
    try:
        if client.max_payload_bytes is None:
            who = await client.stub.WhoAmI(controlplane_pb2.WhoAmIRequest(), metadata=client.metadata)
            client.max_payload_bytes = who.max_payload_bytes or None
        if client.max_payload_bytes is not None and len(payload) > client.max_payload_bytes:
            raise PayloadTooLarge("the call's arguments", len(payload), client.max_payload_bytes)
        ref: bytes = await client.retrying(lambda stub: blobs.upload(stub.PutBlob, payload, metadata=client.metadata))
        return ref
    except grpc.aio.AioRpcError as exc:
        if exc.code() == grpc.StatusCode.INVALID_ARGUMENT and "over the cap" in (exc.details() or ""):
            raise PayloadTooLarge("the call's arguments", len(payload), 0, message=exc.details()) from None
        raise translate(exc, client.ctx) from None


async def incoming(client: Client, event: controlplane_pb2.TaskEvent) -> controlplane_pb2.TaskEvent:
    """``event`` with its result itself in place of a reference to a stored blob."""
    if not event.result.result.startswith(REF_PREFIX):
        return event
    try:
        data = await client.retrying(
            lambda stub: blobs.download(stub.GetBlob, event.result.result, metadata=client.metadata)
        )
    except grpc.aio.AioRpcError as exc:
        raise translate(exc, client.ctx) from None
    resolved = controlplane_pb2.TaskEvent()
    resolved.CopyFrom(event)
    resolved.result.result = data
    return resolved


async def watch_one(client: Client, task_id: str) -> controlplane_pb2.TaskEvent:
    async for event in watch(client, [task_id]):
        return await incoming(client, event)
    raise RuntimeError(f"the controlplane ended the watch of {task_id} without its result")


def submission_id() -> str:
    """A new id for one submission, sent with every copy of it (see the module's doc)."""
    return uuid.uuid4().hex


async def invoke(client: Client, stub_id: str, payload: bytes) -> controlplane_pb2.TaskEvent:
    """Run one call of ``stub_id`` and return its outcome, following it across a controlplane restart."""
    payload = await outgoing(client, payload)
    request = controlplane_pb2.InvokeRequest(stub_id=stub_id, args=payload, submission_id=submission_id())
    task_id = ""
    while not task_id:
        stub, generation = await client.connect()
        try:
            async for event in stub.Invoke(request, metadata=client.metadata):
                client.reached()
                task_id = event.task_id
                if event.HasField("result"):
                    return await incoming(client, event)
            break
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in GONE:
                raise translate(exc, client.ctx) from None
            # before the id came: the same submission again, elsewhere (stored once); after: follow it by id
            await client.lost(exc, generation)
    if not task_id:
        raise RuntimeError("the controlplane ended the call without its result")
    return await watch_one(client, task_id)


async def submit(client: Client, stub_id: str, payloads: Sequence[bytes]) -> list[str]:
    """Store one call of ``stub_id`` per payload; their task ids, in order."""
    payloads = [await outgoing(client, p) for p in payloads]
    request = controlplane_pb2.SubmitRequest(
        stub_id=stub_id, calls=[controlplane_pb2.Call(args=p) for p in payloads], submission_id=submission_id()
    )
    try:
        # the same submission on the next replica while unanswered: stored once (see the module's doc)
        response = await client.retrying(lambda stub: stub.Submit(request, metadata=client.metadata))
    except grpc.aio.AioRpcError as exc:
        raise translate(exc, client.ctx) from None
    return list(response.task_ids)


async def submit_and_watch(
    client: Client, stub_id: str, payloads: Sequence[bytes], accepted: asyncio.Future[list[str]]
) -> AsyncIterator[controlplane_pb2.TaskEvent]:
    """Submit calls and yield their outcomes as they finish; ``accepted`` gets the task ids once stored.

    One stream does both, so the controlplane need not look the tasks up again to watch them. If the
    stream breaks after the ids came (a controlplane restart), the rest is followed with a watch.
    """
    ids: list[str] = []
    left: set[str] = set()
    request = controlplane_pb2.SubmitRequest(
        stub_id=stub_id, calls=[controlplane_pb2.Call(args=p) for p in payloads], submission_id=submission_id()
    )
    while not ids:
        stub, generation = await client.connect()
        try:
            async for batch in stub.SubmitAndWatch(request, metadata=client.metadata):
                client.reached()
                if not ids:
                    ids = [event.task_id for event in batch.events]
                    left = set(ids)
                    accepted.set_result(ids)
                    continue
                for event in batch.events:
                    if event.HasField("result") and event.task_id in left:
                        left.discard(event.task_id)
                        yield event
            break
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in (*GONE, grpc.StatusCode.INTERNAL):
                raise translate(exc, client.ctx) from None
            if not ids and exc.code() not in GONE:
                raise translate(exc, client.ctx) from None
            # before the ids came: the same submission again, elsewhere (stored once); after: follow them by id
            await client.lost(exc, generation)
    if not ids:
        raise RuntimeError("the controlplane ended the submit without the calls' task ids")
    if left:
        async for event in watch(client, [t for t in ids if t in left]):
            yield event
