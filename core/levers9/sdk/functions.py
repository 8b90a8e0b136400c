"""``@levers9.function`` and what it returns: a local function that can also run remotely.

The decorated object still runs locally when called directly; ``.remote``
runs one call on a worker and returns its value, ``.spawn`` starts one and
returns a handle, ``.map`` runs one call per input with many in flight and
yields results in input order. The GPU preference is checked here, on the
user's machine, so a misspelt GPU type fails before anything is sent.

This module holds the decorator, :class:`Function` (its registration as a stub
and its calling methods) and :func:`register`; the rest of the SDK's function
machinery is split by what it does:

- :mod:`levers9.sdk.options`: checking the decorators' options and serialising them into a ``StubConfig``;
- :mod:`levers9.sdk.calls`: calling, watching and outcomes (:class:`FunctionCall`, reconnecting watches);
- :mod:`levers9.sdk.mapping`: ``map``'s batched, windowed submission and in-order results;
- :mod:`levers9.sdk.kinds`: the deployable kinds (``endpoint``, ``asgi``, ``queue``, ``job``, ``box``), built
  on :func:`function`; it imports this module and never the other way round (import them from
  :mod:`levers9.sdk.kinds` or from ``levers9``).

Invariants: a :class:`Function` registers its stub at most once per client and
config (keyed by the config and the pickled handler), lazily, on its first
remote use; every remote method sends the same pickled handler.
``FunctionCall`` stays importable from here.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Generic, ParamSpec, TypeVar

import grpc

from levers9.proto.v1 import controlplane_pb2
from levers9.sdk import serialize
from levers9.sdk.blueprint import Blueprint
from levers9.sdk.builds import build_image
from levers9.sdk.calls import FunctionCall, invoke, outcome, submit
from levers9.sdk.client import Client, client_for, translate
from levers9.sdk.errors import InvalidFunction
from levers9.sdk.mapping import DEFAULT_MAP_CONCURRENCY, input_count, map_calls
from levers9.sdk.options import function_config, stub_config
from levers9.sdk.volumes import Volume, create_volumes

__all__ = ["Function", "FunctionCall", "function", "register"]

#: the stub config's ``image`` until the blueprint's image is built and its ref known
BLUEPRINT_IMAGE = "blueprint"

P = ParamSpec("P")
R = TypeVar("R")


class Function(Generic[P, R]):
    def __init__(self, fn: Callable[P, R], config: dict[str, Any]) -> None:
        functools.update_wrapper(self, fn)
        self.fn = fn
        #: a blueprint given as ``image``: built (and its ref put in the stub's config) at registration, not
        #: here, so that importing the module where its files are not (inside the container) reads nothing
        self._blueprint: Blueprint | None = None
        if isinstance(config.get("image"), Blueprint):
            self._blueprint = config["image"]
            config = {**config, "image": BLUEPRINT_IMAGE}
        self.config = config
        #: the ref of the blueprint's image, per client (a client is one controlplane and workspace)
        self._image_refs: dict[int, str] = {}
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

    async def _config(self, client: Client) -> dict[str, Any]:
        """The config to register: with a blueprint, its image's ref (built first where it must be)."""
        if self._blueprint is None:
            return self.config
        ref = self._image_refs.get(id(client))
        if ref is None:
            ref = self._image_refs[id(client)] = await build_image(client, self._blueprint)
        return {**self.config, "image": ref}

    async def _stub_id(self, client: Client) -> str:
        if self._handler is None:
            self._handler = serialize.dumps_function(self.fn)
        config = await self._config(client)
        digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode() + self._handler).hexdigest()
        key = (id(self), digest)
        known = client.stub_ids.get(key)
        if known is not None:
            return known
        await create_volumes(client, config.get("volumes", ()))
        try:
            response = await client.stub.GetOrCreateStub(
                controlplane_pb2.GetOrCreateStubRequest(config=stub_config(config), handler=self._handler),
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
        value: R = outcome(event, self._source)
        return value

    async def remote_aio(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """``remote`` for async code: awaits without blocking the caller's event loop."""
        client = self._client()
        event = await client.run_async(self._invoke(client, self._arguments(args, kwargs)))
        value: R = outcome(event, self._source)
        return value

    def _arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
        """The call's pickled arguments."""
        return serialize.dumps_args(args, kwargs)

    async def _invoke(self, client: Client, payload: bytes) -> controlplane_pb2.TaskEvent:
        return await invoke(client, await self._stub_id(client), payload)

    def spawn(self, *args: P.args, **kwargs: P.kwargs) -> FunctionCall[R]:
        """Start one call and return at once; ``.get()`` on the handle waits for its value."""
        client = self._client()
        [task_id] = client.run(self._submit(client, [self._arguments(args, kwargs)]))
        return FunctionCall(client, task_id, self._source)

    async def _submit(self, client: Client, payloads: Sequence[bytes]) -> list[str]:
        return await submit(client, await self._stub_id(client), payloads)

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
        total = input_count(iterables)
        show = sys.stderr.isatty() if progress is None else progress
        client = self._client()
        yield from map_calls(
            client,
            lambda: self._stub_id(client),
            payloads,
            concurrency=concurrency,
            return_exceptions=return_exceptions,
            progress=(total, self.config["name"]) if show else None,
            source=self._source,
        )


# ---------------------------------------------------------------------- the decorator


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
    image: str | Blueprint = "host",
    keep_warm: float | None = None,
    checkpoint: bool = False,
    app: str | None = None,
    name: str | None = None,
    volumes: Sequence[Volume] | None = None,
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
    environment variables; ``env`` adds plain ones. ``image`` is ``"host"`` (the
    worker's own Python), a local image path on the worker, or a
    :class:`~levers9.Blueprint`: built into an image on the first call or
    deploy (steps the workspace built before are not run again, and the
    build's output is printed to stderr), then run under runc or gVisor. ``checkpoint=True``
    snapshots the first container once its start-up (the module's top-level
    code: imports, model loading) is done, where the pool's runtime can; later
    containers of the function start from that snapshot instead of running it
    again. A long-running server calls :func:`levers9.ready` itself instead.
    ``volumes`` lists :class:`~levers9.Volume` and :class:`~levers9.CloudBucket` objects mounted in each
    container (a volume is made on the first call or deploy that names it).
    """
    if isinstance(fallback, str):
        fallback = [fallback]

    def wrap(fn: Callable[P, R]) -> Function[P, R]:
        if inspect.isclass(fn):
            raise InvalidFunction(f"@levers9.function decorates functions, not classes ({fn.__qualname__})")
        config = function_config(
            fn,
            "function",
            cpu=cpu,
            memory=memory,
            gpu=gpu,
            gpu_count=gpu_count,
            fallback=fallback,
            fallback_after=fallback_after,
            retries=retries,
            timeout=timeout,
            secrets=secrets,
            env=env,
            image=image,
            keep_warm=keep_warm,
            checkpoint=checkpoint,
            app=app,
            name=name,
            volumes=volumes,
        )
        return Function(fn, config)

    return wrap(_fn) if _fn is not None else wrap


def register(fn: Function[Any, Any], context: str | None = None) -> str:
    """Register ``fn``'s stub now (``levers9 deploy`` and tests); returns its id."""
    client = client_for(context)
    return client.run(fn._stub_id(client))
