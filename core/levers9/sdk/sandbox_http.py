"""The sandbox SDK's transport: the controlplane's REST API (``{context.http}/api/v1``) over httpx.

Sandboxes are driven over REST rather than gRPC so that the same routes serve other languages. Every
request carries the context's token as ``Authorization: Bearer``, and a TLS controlplane is verified
with the context's ``ca_file`` (the system's trust store when it is empty). A context with no ``http``
field cannot reach the API: :func:`transport_for` refuses it, naming the context file, the context and
the field.

One event loop runs every request of the process, in a daemon thread (:func:`_loop`): synchronous
callers block on :meth:`SandboxHTTP.run`, async callers await :meth:`SandboxHTTP.run_async` from their
own loop, and a process's output is read there in the background (:mod:`levers9.sdk.sandbox_output`).
So one ``httpx.AsyncClient`` per context serves both, on the loop that made it.

Invariant, no hangs: every request has a timeout (:data:`REQUEST_TIMEOUT_S`, :data:`CREATE_TIMEOUT_S`
for a start, which may pull an image; a file transfer's timeout bounds each read and write, not the
whole file) except the NDJSON output stream, which ends when its process does or carries an error
when the sandbox goes first (an exec that waits is one too, after its first line, which must come within
:data:`REQUEST_TIMEOUT_S`). A failure to reach the controlplane is a
:class:`~levers9.sdk.sandbox_errors.SandboxConnectionError` naming the URL and the context; a refusal
is the exception :func:`~levers9.sdk.sandbox_errors.error_for` picks from its error body.
"""

from __future__ import annotations

import asyncio
import ssl
import threading
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import httpx

from levers9.sdk.context import Context, ContextError, current_context
from levers9.sdk.sandbox_errors import SandboxConnectionError, SandboxEnded, SandboxError, SandboxGone, error_for

__all__ = ["CREATE_TIMEOUT_S", "REQUEST_TIMEOUT_S", "SandboxHTTP", "SandboxRef", "transport_for"]

T = TypeVar("T")

#: the longest wait for an answer to one request (and, for files, for each piece of a transfer)
REQUEST_TIMEOUT_S = 60.0
#: the longest wait for a sandbox to start: the worker may pull its image first
CREATE_TIMEOUT_S = 600.0
#: the longest wait to connect, for every request including output streams
CONNECT_TIMEOUT_S = 10.0

_loop_lock = threading.Lock()
_loop_ref: asyncio.AbstractEventLoop | None = None
_transports: dict[tuple[str, str, str, str, str], SandboxHTTP] = {}


def _loop() -> asyncio.AbstractEventLoop:
    """The process's sandbox loop, started on first use in a daemon thread."""
    global _loop_ref
    with _loop_lock:
        if _loop_ref is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="levers9 sandboxes", daemon=True).start()
            _loop_ref = loop
        return _loop_ref


def transport_for(context: str | None = None) -> SandboxHTTP:
    """The transport of the named (or current) context; ContextError when it has no ``http`` field."""
    ctx = current_context(context)
    if not ctx.http.strip():
        from levers9.sdk.context import ENV_ONLY_NAME, config_path

        where = "made from $LEVERS9_GRPC" if ctx.name == ENV_ONLY_NAME else f"in {config_path()}"
        raise ContextError(
            f"context {ctx.name!r} ({where}) has no http field: sandboxes are driven over the controlplane's "
            f"REST API, so the context needs its HTTP URL (`levers9 context add {ctx.name} --grpc ... "
            "--http http://HOST:PORT`; `levers9 up` writes it)"
        )
    key = (ctx.name, ctx.http, ctx.token, ctx.environment, ctx.ca_file)
    with _loop_lock:
        transport = _transports.get(key)
        if transport is None:
            transport = _transports[key] = SandboxHTTP(ctx)
        return transport


class SandboxHTTP:
    """Requests to one controlplane's sandbox API, run on the process's sandbox loop."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.base = ctx.http.rstrip("/") + "/api/v1"
        self._headers = dict(ctx.credentials())
        self._client: httpx.AsyncClient | None = None

    def _http(self) -> httpx.AsyncClient:
        """The client, made on the loop (it must be used where it was made)."""
        if self._client is None:
            verify: ssl.SSLContext | bool = True
            if self.ctx.ca_file:
                try:
                    verify = ssl.create_default_context(cafile=self.ctx.ca_file)
                except (OSError, ssl.SSLError) as exc:
                    raise ContextError(f"context {self.ctx.name!r}: ca_file {self.ctx.ca_file}: {exc}") from None
            self._client = httpx.AsyncClient(
                base_url=self.base,
                headers=self._headers,
                verify=verify,
                timeout=httpx.Timeout(REQUEST_TIMEOUT_S, connect=CONNECT_TIMEOUT_S),
            )
        return self._client

    # ------------------------------------------------------------------ running

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the sandbox loop and wait for it here (synchronous code)."""
        loop = _loop()
        if _running_loop() is loop:
            coro.close()
            raise RuntimeError("levers9: a blocking sandbox call was made on the SDK's own loop; use .aio")
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        try:
            return future.result()
        except KeyboardInterrupt:
            future.cancel()
            raise

    async def run_async(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` on the sandbox loop from another event loop (or from the sandbox loop itself)."""
        loop = _loop()
        if asyncio.get_running_loop() is loop:
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Start ``coro`` on the sandbox loop and return at once (a background reader)."""
        asyncio.run_coroutine_threadsafe(coro, _loop())

    # ------------------------------------------------------------------ requests

    def unreachable(self, what: str, exc: Exception, timeout: float | None) -> SandboxConnectionError:
        if isinstance(exc, httpx.TimeoutException):
            reason = f"no answer within {timeout:g} s" if timeout else f"timed out ({type(exc).__name__})"
        else:
            reason = str(exc) or type(exc).__name__
        return SandboxConnectionError(
            f"{what}: cannot reach the controlplane at {self.ctx.http} (context {self.ctx.name!r}): {reason}"
        )

    async def request(
        self,
        method: str,
        path: str,
        *,
        what: str,
        json: Any = None,
        params: dict[str, str] | None = None,
        content: Any = None,
        timeout: float = REQUEST_TIMEOUT_S,
        sandbox_id: str = "",
        unsupported: str = "",
    ) -> Any:
        """The JSON answer of one request; the matching SandboxError when it is refused or cannot be sent."""
        try:
            response = await self._http().request(
                method,
                path,
                json=json,
                params=params,
                content=content,
                timeout=httpx.Timeout(timeout, connect=CONNECT_TIMEOUT_S),
            )
        except httpx.HTTPError as exc:
            raise self.unreachable(what, exc, timeout) from None
        if response.status_code >= 400:
            raise error_for(
                response.status_code, response.content, what=what, sandbox_id=sandbox_id, unsupported=unsupported
            )
        try:
            return response.json()
        except ValueError:
            raise SandboxError(
                f"{what}: the controlplane's answer ({response.status_code}) is not JSON", status=response.status_code
            ) from None

    @asynccontextmanager
    async def stream(
        self,
        method: str,
        path: str,
        *,
        what: str,
        params: dict[str, str] | None = None,
        json: Any = None,
        read_timeout: float | None = REQUEST_TIMEOUT_S,
        sandbox_id: str = "",
    ) -> AsyncIterator[httpx.Response]:
        """A streamed answer, its status checked; ``read_timeout`` None waits for each piece as long as it takes."""
        timeout = httpx.Timeout(REQUEST_TIMEOUT_S, connect=CONNECT_TIMEOUT_S, read=read_timeout)
        try:
            async with self._http().stream(method, path, params=params, json=json, timeout=timeout) as response:
                if response.status_code >= 400:
                    body = await response.aread()
                    raise error_for(response.status_code, body, what=what, sandbox_id=sandbox_id)
                yield response
        except httpx.HTTPError as exc:
            raise self.unreachable(what, exc, read_timeout) from None

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


class SandboxRef:
    """One sandbox as its parts see it: its id and the transport that reaches it."""

    def __init__(self, http: SandboxHTTP, sandbox_id: str) -> None:
        self.http = http
        self.id = sandbox_id

    def path(self, tail: str = "") -> str:
        return f"/sandboxes/{self.id}{tail}"

    async def request(self, method: str, tail: str, *, what: str, **options: Any) -> Any:
        """A request about this sandbox (``tail`` after ``/sandboxes/{id}``); errors name it."""
        return await self.http.request(method, self.path(tail), what=what, sandbox_id=self.id, **options)

    async def explain(self, error: SandboxError) -> SandboxError:
        """``error`` (a broken stream, an unreachable worker), or the sandbox's end when that is the reason."""
        try:
            info = await self.request("GET", "", what=f"sandbox {self.id}")
        except SandboxError:
            return error
        state, reason = info.get("state"), info.get("reason") or "no reason given"
        if state == "gone":
            return SandboxGone(f"sandbox {self.id} is gone: {reason}", type="SandboxGone", sandbox_id=self.id)
        if state == "ended":
            return SandboxEnded(f"sandbox {self.id} has ended: {reason}", type="SandboxEnded", sandbox_id=self.id)
        return error


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
