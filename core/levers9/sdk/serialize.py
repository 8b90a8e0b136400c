"""Turning functions, arguments and results into bytes that travel with the call.

A function defined in a user's script (``__main__``, or a file ``levers9 run``
imported) does not exist on the worker, so it is pickled by value; a function
from an installed package is pickled by reference and imported there.
"""

from __future__ import annotations

import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import cloudpickle

__all__ = ["dumps_args", "dumps_function", "loads"]

_INSTALLED = {
    str(Path(p).resolve())
    for key in ("stdlib", "platstdlib", "purelib", "platlib")
    if (p := sysconfig.get_paths().get(key))
}


def _is_users_own(module: ModuleType) -> bool:
    if module.__name__ == "__main__":
        return True
    file = getattr(module, "__file__", None)
    if not file:
        return False
    path = str(Path(file).resolve())
    if any(path.startswith(prefix + "/") for prefix in _INSTALLED):
        return False
    return not module.__name__.startswith("levers9")


def dumps_function(fn: Callable[..., Any]) -> bytes:
    module = sys.modules.get(getattr(fn, "__module__", "") or "")
    if module is not None and module.__name__ != "__main__" and _is_users_own(module):
        cloudpickle.register_pickle_by_value(module)
        try:
            data: bytes = cloudpickle.dumps(fn)
            return data
        finally:
            cloudpickle.unregister_pickle_by_value(module)
    plain: bytes = cloudpickle.dumps(fn)
    return plain


def dumps_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
    data: bytes = cloudpickle.dumps((args, kwargs))
    return data


def loads(data: bytes) -> Any:
    return cloudpickle.loads(data)
