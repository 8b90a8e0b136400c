"""One cloud SDK call, its failure typed: what every cloud plugin does around each request.

A plugin knows what some of its SDK's failures mean (a capacity answer, a
refused credential, a throttle) and translates those into the errors of
:mod:`levers9.hooks.errors`, chained to the original so the SDK's own words
stay in the traceback. A failure it does not know is never guessed at: it
propagates as it is, and the core reports it as a plugin error naming the hook.
A typed error raised inside the call (the plugin's own ``InvalidRequest``,
say) passes through untranslated.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn, TypeVar

from levers9.hooks.errors import ProviderError

__all__ = ["Translate", "raise_typed", "typed_call"]

T = TypeVar("T")

#: a plugin's translation of one failure: the typed error it means, or None when its meaning is not known
Translate = Callable[[Exception], ProviderError | None]


def raise_typed(exc: Exception, translate: Translate) -> NoReturn:
    """Raise the typed error ``exc`` means (chained to it), or ``exc`` itself when ``translate`` does not know it."""
    typed = translate(exc)
    if typed is None:
        raise exc
    raise typed from exc


def typed_call(call: Callable[[], T], translate: Translate) -> T:
    """``call()``; a typed error it raises passes as it is, any other failure goes through :func:`raise_typed`."""
    try:
        return call()
    except ProviderError:
        raise
    except Exception as exc:
        raise_typed(exc, translate)
