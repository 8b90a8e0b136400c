"""Every page of an OCI list call, with no retry hidden inside.

OCI list operations answer one page and name the next in the
``opc-next-page`` header (the SDK's ``Response.next_page``); the caller sends
it back as ``page``. :func:`all_pages` follows that chain and returns every
item.

Why not ``oci.pagination.list_call_get_all_results``: that helper wraps each
page's call in ``oci.retry.DEFAULT_RETRY_STRATEGY`` whatever the client was
given, so a 429 or a 5xx is retried with backoff for minutes (up to eight
attempts, 600 s in all) inside one hook call, far past the core's deadline,
and out of sight of the core, which retries ``Throttled`` itself. Here each
page is one call with the client's own strategy (none: see
:mod:`levers9_oci.clients`), and the first failure ends the listing.

Invariant: at most :data:`MAX_PAGES` pages per listing; a chain longer than
that (a server that never stops naming a next page) raises RuntimeError
rather than looping for ever.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["MAX_PAGES", "all_pages"]

#: more pages than any compartment's instances or a region's shapes need
MAX_PAGES = 1000


def all_pages(list_call: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
    """Call ``list_call(*args, **kwargs)`` page after page; every item of every page's ``data``."""
    items: list[Any] = []
    page: str | None = None
    for _ in range(MAX_PAGES):
        response = list_call(*args, **kwargs) if page is None else list_call(*args, page=page, **kwargs)
        items.extend(response.data)
        page = response.next_page
        if not page:
            return items
    raise RuntimeError(f"{getattr(list_call, '__name__', 'list call')} named a next page {MAX_PAGES} times")
