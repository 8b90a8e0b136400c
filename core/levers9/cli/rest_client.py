"""The CLI's client of the controlplane's REST API: the current context's ``http`` URL, token and environment.

Every failure becomes one line a person can act on (:class:`RestFailed`): the
server's own error message for an answer of 4xx or 5xx, the address and what to
check when nothing answers. The token is sent as a header, never put in a URL
or a message.
"""

from __future__ import annotations

import ssl
from typing import Any

import httpx

from levers9.sdk.context import Context, ContextError, current_context

__all__ = ["REQUEST_TIMEOUT_S", "Rest", "RestFailed", "rest"]

REQUEST_TIMEOUT_S = 30.0


class RestFailed(Exception):
    """A request that did not succeed; ``status`` is the HTTP status (0 when nothing answered)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class Rest:
    def __init__(self, ctx: Context) -> None:
        if not ctx.http.strip():
            raise RestFailed(
                f"context {ctx.name!r} has no http field (the controlplane's HTTP URL): `levers9 up` and "
                f"`levers9 login` write it, or `levers9 context add {ctx.name} --grpc ... --http http://HOST:PORT`"
            )
        self.ctx = ctx
        verify: ssl.SSLContext | bool = True
        if ctx.ca_file:
            try:
                verify = ssl.create_default_context(cafile=ctx.ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise RestFailed(f"context {ctx.name!r}: ca_file {ctx.ca_file}: {exc}") from None
        self._client = httpx.Client(
            base_url=ctx.http.rstrip("/") + "/api/v1",
            headers=dict(ctx.credentials()),
            verify=verify,
            timeout=httpx.Timeout(REQUEST_TIMEOUT_S, connect=10.0),
        )

    def request(self, method: str, path: str, *, json: Any = None, params: dict[str, Any] | None = None) -> Any:
        """The answer's JSON (None for 204); RestFailed with the server's message otherwise."""
        try:
            response = self._client.request(method, path, json=json, params=params)
        except httpx.HTTPError as exc:
            raise RestFailed(
                f"cannot reach the controlplane at {self.ctx.http} ({type(exc).__name__}: {exc}); is it running? "
                "(`levers9 up`, or check the context with `levers9 context show`)"
            ) from None
        if response.status_code == 204:
            return None
        try:
            body = response.json()
        except ValueError:
            body = None
        if response.status_code >= 400:
            message = body.get("error", {}).get("message") if isinstance(body, dict) else None
            message = message or f"HTTP {response.status_code} from {method} {path}"
            if response.status_code == 401:
                message = (
                    f"the controlplane at {self.ctx.http} did not accept the token of context {self.ctx.name!r}: {message}; "
                    "sign in again with `levers9 login` (or set one with `levers9 context add`)"
                )
            raise RestFailed(message, response.status_code)
        return body

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params={k: v for k, v in params.items() if v is not None} or None)

    def post(self, path: str, body: Any = None) -> Any:
        return self.request("POST", path, json=body)

    def put(self, path: str, body: Any = None) -> Any:
        return self.request("PUT", path, json=body)

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)

    def close(self) -> None:
        self._client.close()


def rest(context: str | None = None) -> Rest:
    """The client of the named (or current) context; RestFailed when there is none usable."""
    try:
        return Rest(current_context(context))
    except ContextError as exc:
        raise RestFailed(str(exc)) from None
