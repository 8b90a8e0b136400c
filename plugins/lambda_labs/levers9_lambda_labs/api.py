"""The Lambda Cloud API v1 client: plain JSON over httpx, one ``httpx.Client`` per (API URL, key variable).

What it relies on (the API reference, OpenAPI document of the Cloud API v1):
``Authorization: Bearer <key>``; a success is ``{"data": ...}``; a failure is
``{"error": {"code", "message", "suggestion"}}`` with a 4xx/5xx status. Paths
are below ``settings.api_url`` (``https://cloud.lambda.ai/api/v1``).

Invariants:

* **The key is read at call time** from the environment variable the pool names
  (:func:`api_key`), sent only in the ``Authorization`` header of each request
  and never stored, logged or put in an error. A rotated key is used from the
  next call on.
* **No retries, no redirects.** httpx retries nothing by itself, and a launch
  must reach the planner in one call; a redirect of a ``POST`` would turn it
  into a ``GET``, so ``api_url`` must name the API itself.
* **Thread-safe.** Clients are created under a lock and httpx clients may be
  shared by threads; :meth:`CloudApi.close` closes every client (shutdown).

Failures: an error answer raises :class:`~levers9_lambda_labs.errors.ApiFailure`
(status, code, message, suggestion, ``Retry-After``); no answer at all raises
:class:`Unreachable`, whose ``sent`` says whether the request may have reached
the API (a read timeout or a reset after sending) or certainly did not (the
connection was refused). httpx is imported inside the functions that use it,
so loading the plugin (``levers9 --help``) does not import it.
"""

from __future__ import annotations

import email.utils
import os
import threading
import time
from typing import TYPE_CHECKING, Any

from levers9_lambda_labs.errors import ApiFailure

if TYPE_CHECKING:
    import httpx

    from levers9_lambda_labs.settings import LambdaLabsSettings

__all__ = ["CloudApi", "Unreachable", "api_key"]

_USER_AGENT = "levers9-lambda-labs"


class Unreachable(Exception):
    """No answer from the API (refused, reset, timed out); ``sent``: the request may have been acted on."""

    def __init__(self, detail: str, *, sent: bool) -> None:
        super().__init__(detail)
        self.detail = detail
        self.sent = sent


def api_key(settings: LambdaLabsSettings) -> str | None:
    """The API key from the environment variable ``settings.api_key_env``, or None when unset or empty."""
    value = os.environ.get(settings.api_key_env, "").strip()
    return value or None


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _failure(response: httpx.Response) -> ApiFailure:
    code: str | None = None
    message = response.reason_phrase or f"HTTP {response.status_code}"
    suggestion: str | None = None
    try:
        body = response.json()
    except ValueError:
        body = None
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        code = error.get("code") if isinstance(error.get("code"), str) else None
        if isinstance(error.get("message"), str) and error["message"]:
            message = error["message"]
        if isinstance(error.get("suggestion"), str) and error["suggestion"]:
            suggestion = error["suggestion"]
    return ApiFailure(
        status=response.status_code,
        code=code,
        message=message,
        suggestion=suggestion,
        retry_after=_retry_after(response.headers.get("Retry-After")),
    )


class CloudApi:
    """The plugin's HTTP clients, one per (API URL, key variable); see the module docstring."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clients: dict[tuple[str, str], httpx.Client] = {}

    def _client(self, settings: LambdaLabsSettings) -> httpx.Client:
        import httpx

        base = str(settings.api_url).rstrip("/")
        key = (base, settings.api_key_env)
        with self._lock:
            client = self._clients.get(key)
            if client is None:
                client = httpx.Client(
                    base_url=base + "/",
                    timeout=httpx.Timeout(settings.request_timeout_s),
                    follow_redirects=False,
                    headers={"Accept": "application/json", "User-Agent": _USER_AGENT},
                )
                self._clients[key] = client
            return client

    def call(self, settings: LambdaLabsSettings, key: str, method: str, path: str, body: Any = None) -> Any:
        """``method path`` (relative to ``api_url``) with ``key``; the answer's ``data``.

        :raises ApiFailure: the API answered with an error.
        :raises Unreachable: no answer.
        """
        import httpx

        client = self._client(settings)
        try:
            response = client.request(
                method,
                path.lstrip("/"),
                json=body,
                headers={"Authorization": f"Bearer {key}"},
                timeout=settings.request_timeout_s,
            )
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise Unreachable(f"cannot connect to {client.base_url.host}: {type(exc).__name__}", sent=False) from None
        except httpx.TimeoutException as exc:
            raise Unreachable(
                f"no answer within {settings.request_timeout_s:g} s ({type(exc).__name__})", sent=True
            ) from None
        except httpx.TransportError as exc:
            raise Unreachable(f"the connection failed ({type(exc).__name__}: {exc})", sent=True) from None
        if response.is_success:
            try:
                payload = response.json()
            except ValueError:
                raise ApiFailure(response.status_code, None, "the answer is not JSON") from None
            if not isinstance(payload, dict) or "data" not in payload:
                raise ApiFailure(response.status_code, None, "the answer has no 'data'")
            return payload["data"]
        raise _failure(response)

    def close(self) -> None:
        """Close every client; a later call opens a new one."""
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.close()
