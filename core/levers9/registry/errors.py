"""The one error every registry module raises: :class:`RegistryError`.

A registry answers a failed request with a status and, by the distribution
spec, a JSON body ``{"errors": [{"code": ..., "message": ...}]}``; the error
keeps that code (``MANIFEST_UNKNOWN``, ``BLOB_UNKNOWN``, ``DIGEST_INVALID``,
``UNAUTHORIZED``, ``DENIED``...) so callers can tell a missing image from a
refused login without parsing a sentence. A connection that could not be made,
or a transfer cut short, has no code and no status.

A ref or digest that is malformed is an :class:`InvalidRefError` (also a
:class:`ValueError`): bad input, refused before any request is made.

Invariant: a :class:`RegistryError`'s message names the registry (``host[:port]``), the repository
when there is one, and the operation, so a failure deep in a pull says which
image and which step.
"""

from __future__ import annotations

from levers9.hooks.errors import Levers9Error

__all__ = ["InvalidRefError", "RegistryError"]


class RegistryError(Levers9Error):
    """A registry refused a request, could not be reached, or served something that does not check out."""

    def __init__(
        self,
        message: str,
        *,
        registry: str,
        operation: str,
        repository: str | None = None,
        code: str | None = None,
        status: int | None = None,
    ) -> None:
        self.message = message
        #: ``host[:port]`` of the registry
        self.registry = registry
        #: what was being done: ``push blob``, ``get manifest``, ``start``...
        self.operation = operation
        self.repository = repository
        #: the registry's own error code (the distribution spec's ``errors[].code``), when it sent one
        self.code = code
        #: the HTTP status of the answer, when one came
        self.status = status
        super().__init__(str(self))

    def __str__(self) -> str:
        where = f"registry {self.registry}" + (f", repository {self.repository}" if self.repository else "")
        tail = ", ".join(
            part for part in (self.code, f"HTTP {self.status}" if self.status is not None else None) if part
        )
        return f"{where}: {self.operation} failed: {self.message}" + (f" ({tail})" if tail else "")


class InvalidRefError(Levers9Error, ValueError):
    """An image ref, repository name or digest that is malformed; the message says what would be accepted."""
