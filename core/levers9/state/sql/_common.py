"""Helpers shared by the stores."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from levers9.state.errors import NotFound
from levers9.state.sql.models import Base

T = TypeVar("T")
M = TypeVar("M", bound=Base)

#: how often an insert that lost a race on a unique constraint is retried
RACE_RETRIES = 8


async def retry_on_race(attempt: Callable[[], Awaitable[T]]) -> T:
    """Run ``attempt`` (one whole transaction) again when a concurrent writer took the same unique key.

    Retrying the whole transaction, rather than using savepoints, works the
    same on PostgreSQL (where a failed statement aborts the transaction) and
    SQLite; each retry re-reads, so it finds what the other writer made.
    """
    for remaining in range(RACE_RETRIES - 1, -1, -1):
        try:
            return await attempt()
        except IntegrityError:
            if not remaining:
                raise
    raise AssertionError("unreachable")


async def require(session: AsyncSession, model: type[M], ident: str, kind: str, *, lock: bool = False) -> M:
    """The row ``ident`` of ``model``, or NotFound naming ``kind``; ``lock`` holds it until the transaction ends."""
    row = await session.get(model, ident, with_for_update=lock)
    if row is None:
        raise NotFound(kind, ident)
    return row


def check_name(value: str, what: str, max_length: int) -> str:
    """Names are shown in CLIs and URLs, so they must be non-empty, printable and bounded."""
    if not value or len(value) > max_length or not value.isprintable() or value != value.strip():
        raise ValueError(
            f"{what} {value!r} is not valid: it must be 1-{max_length} printable characters "
            "without leading or trailing spaces"
        )
    return value
